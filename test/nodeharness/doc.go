// Package nodeharness is the one node harness of the test suites: a
// network namespace standing in for a node, a membrane-agent on the
// Linux datapath in it (in the test's process through agent.Start, or a
// real membrane-agent process that the test can restart and SIGKILL),
// and a libcni network whose pods are added and deleted by the real
// membrane-cni plugin, executed in the node's namespace as a runtime on
// the node would.
//
// A suite's TestMain calls Main (or Run) once, which builds membrane-cni
// and the other programs it names; New makes a node with Options for the
// variations (dual-stack, a netns of the caller's such as a node on an
// underlay, its own bpffs instance, the CNI network's name and MTU). The
// agent's variations (tunnel or native routing, L7 proxy, DNS proxy,
// Kubernetes mode, a state directory kept across restarts) are flags of
// a process (Node.Process) or a change to the in-process agent's
// agent.Config (Node.StartAgent). Everything a node makes (namespaces,
// mounts, pins, processes, pods) is removed by the test's cleanups.
package nodeharness
