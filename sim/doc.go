// Package sim is membrane-sim's harness: it drives thousands of endpoints
// through a real agent (actors, index, REST API on its unix socket, state
// directory) in one process with the fake datapath, injects faults and
// crashes, checks invariants during and after the run, and reports
// throughput, latency, heap and violations (text, JSON, HTML).
//
// A run (Run) starts the agent, ramps up to Scenario.Endpoints live pods,
// churns for Scenario.Duration (each lifecycle deletes a random live pod
// and creates a new one: POST /v1/ipam, sync PUT, regenerations; some
// relabel a random live pod), with faults and crash/restarts; then it
// switches faults off, lets the agent settle, sweeps what ambiguous
// failures left, checks every invariant with the endpoints still live,
// measures the heap per live endpoint, deletes every pod, settles and
// checks again, stops the agent and counts goroutines.
//
// The harness behaves like kubelet: a failed ADD is followed by a DEL, a
// DEL is retried until acknowledged, and an outcome that may or may not
// have happened (timeout, reset, 500) is reconciled, never assumed. Its
// model (model.go) records what was acknowledged, and each pod keeps a
// short history that violations quote.
//
// Who owns what: Driver (driver.go) is how pods reach the agent — over the
// REST API with the fake datapath; with --datapath linux (linux_linux.go)
// the real membrane-cni runs ADD and DEL in a network namespace per pod.
// Target (target.go) starts, crashes, restarts and observes the agent,
// in-process (on the Linux datapath in a netns the harness made, for
// linux). Invariant checks (checks.go) are pure functions over a
// Snapshot; endchecks.go adds realised policy, ipcache and kernel checks;
// policychurn.go changes policies during the churn.
//
// RunMultiNode (multinode*.go, membrane-sim --nodes N) is the multi-node
// run: N agents in kvstore mode sharing one etcd (embedded, or a child
// process whose restarts are SIGKILLs), churn, agent crashes, etcd
// restarts and a drain, then cross-node checks (identities, ipcaches,
// etcd's endpoints and, after the identity GC, its identities), with
// each endpoint's convergence to the other nodes' ipcaches timed.
//
// How it works (ARCHITECTURE.md has the map):
//
// `sim/`, `cmd/membrane-sim` — the load, fault and crash harness.
// `linux_linux.go` is `--datapath linux`: the in-process agent on the
// Linux datapath in a netns the harness made, pins on a bpffs it mounted,
// pods attached by the real membrane-cni through libcni in a netns each
// (all removed at the end, `AbortCleanup` on a second interrupt);
// `policychurn.go` imports/replaces/deletes policies during churn;
// `endchecks.go` checks realised against computed policy, the ipcache and
// (linux) host veths and pins against the endpoints. `multinode.go` is
// `--nodes N`: N in-process agents in kvstore mode sharing one etcd
// (`multinode_etcd.go`: embedded, or a child process that restarts
// SIGKILL), churn, agent crashes and etcd restarts, a drain, then the
// cross-node checks (ipcache = the other nodes' live endpoints, etcd =
// each node's, `multinode_gc.go`: etcd's identities = those live endpoints
// hold, after the identity GC); `multinode_conv.go` times each endpoint's
// arrival in the other nodes' ipcaches (the agents'
// `Config.KvstoreObserver`, called when the mirror's front-door call
// returned).
package sim
