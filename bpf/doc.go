// Package bpf will own the eBPF C sources of the endpoint programs
// (from-container, to-container), their bpf2go-generated Go bindings and
// committed objects, and the map layouts (ipcache LPM trie, per-endpoint
// policy map, conntrack, drop counters and the drop-notification ring
// buffer). It lands with the BPF datapath and network policy issue; the
// loader that attaches the programs lives in datapath/.
package bpf
