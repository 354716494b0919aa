// Package nodesnap takes what installing Membrane may change on a node,
// as sorted lines, so that an uninstall test compares the node after
// with the node before and fails with a readable diff: devices,
// addresses, routes of every table, rules, permanent neighbours,
// nftables tables and chains, legacy iptables, qdiscs, tc filters, TCX
// programs on every device, BPF programs attached to cgroups, and the
// files under given directories (bpffs, CNI directories, state).
//
// It works on any node a test can reach: the node harness's namespaces
// (test/install) or a kubelet node of the e2e cluster (test/e2e), through
// the Node the caller fills in.
package nodesnap
