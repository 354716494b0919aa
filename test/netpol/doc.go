// Package netpol is the NetworkPolicy conformance table, in the style of
// the upstream e2e suite (kubernetes test/e2e/network/netpol): a world
// of namespaces x, y, z with pods a, b, c each, made by the real
// membrane-cni plugin on an agent with the Linux datapath and its BPF
// programs (one node of test/nodeharness); TCP and UDP servers on ports 80 and 81 in every
// pod; per case, NetworkPolicy objects imported through PUT /v1/policy
// and the full 9x9 reachability matrix per port and protocol, probed
// with real traffic and compared with an independent model of the
// NetworkPolicy spec (test/netpolmodel), not with the
// agent's policy code. A mismatch prints the expected, observed and
// comparison matrices as the upstream suite does.
//
// The tests need root (netns, veths, BPF): they skip without it unless
// CI is set, and then fail.
package netpol
