// Package crash holds the crash-safety tests of issue #5: a real
// membrane-agent process (test/nodeharness, built by TestMain) is killed with SIGKILL at
// random moments during a churn of ADDs and DELs and restarted on the same
// state directory, and the invariants restore promises are checked after
// every restart (no address owned twice, every allocation bound to an
// endpoint, every persisted endpoint back or deleted, deletions queued
// while the agent was down done, no orphan veths or pins after GC). The
// fake-datapath runs need no privileges; the Linux runs (root) drive the
// real CNI plugin in test-made network namespaces and also check that pod
// traffic survives an agent restart and that a full state disk fails
// cleanly.
package crash
