// Package datapath holds the agent's datapath tests end to end on one
// node (test/nodeharness): pods made by the real membrane-cni plugin on
// an agent on the Linux datapath, with ADD, CHECK, DEL, STATUS and GC
// through libcni, dual-stack and IPv6-only nodes, network policy and
// Service translation with real TCP and UDP through the BPF programs,
// the pinned ipcache across restarts, and the Service benchmark against
// kube-proxy's iptables rules.
package datapath
