// Package procmem gives back memory the agent process touched once: the
// pages of its own executable that start-up read (package initialisers
// of the Kubernetes, etcd and xDS libraries, the flag and scheme
// registrations) and steady state does not use again.
//
// They are clean file-backed pages of the binary, counted in the
// process's RssFile (BENCHMARKS.md "Agent memory": 44-60 MiB of the
// agent's VmRSS, most of it never read after start-up). ReleaseExecutable
// asks the kernel to reclaim them (madvise MADV_PAGEOUT); what the agent
// uses later is read back on first touch, so the resident part settles at
// the working set. The cost is those reads: page faults served from disk
// (or the page cache, when the kernel kept the page) on the first use of
// each code path after the release.
package procmem

// Release is what ReleaseExecutable advised.
type Release struct {
	Mappings int    // the executable's read-only mappings
	Bytes    uint64 // their size
}
