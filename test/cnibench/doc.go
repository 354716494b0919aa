// Package cnibench measures CNI ADD/DEL latency and concurrent ADD
// throughput of membrane-cni against the reference ptp + host-local
// plugins, driven through libcni as container runtimes drive plugins.
// Run it with `make bench-cni` (root); docs/cni-bench.md has the results.
package cnibench
