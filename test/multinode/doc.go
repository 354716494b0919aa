// Package multinode runs several Membrane nodes on one machine, as root:
// each node is a network namespace with its own membrane-agent process
// (started inside it), bpffs mount, state directory, socket and CNI
// configuration; the nodes' eth0 are ports of an underlay bridge in a
// harness namespace that holds the node addresses' segment (and an
// "outside" host for the masquerade case). Pods are made by the real
// membrane-cni plugin through libcni, each in its own netns (every node
// is a test/nodeharness node in a namespace on the underlay). The nodes
// learn about each other from a shared nodes file (--nodes-file).
// Nothing touches the host's own network; every process, mount, netns
// and link is removed at cleanup, also when a test fails.
//
// The tests skip when not root and CI is unset (under CI=true they fail).
// Numbers: MEMBRANE_XNODE_BENCH=1 go test -run TestCrossNodeNumbers -v ./test/multinode/
// (BENCHMARKS.md, "Cross-node datapath (issue 15)").
package multinode
