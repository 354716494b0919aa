// Package heapprofile turns the Go runtime's heap profiling off in the
// agent's process before most package initialisers run, and on again for
// --pprof. Profiling every 512 KiB allocated (the runtime's default)
// keeps a table of the sampled call stacks (1.4 MiB of hash buckets
// alone, BuckHashSys) and unwinds each sampled stack, reading the
// executable's pclntab pages: about 1.5-2.5 MiB of RssAnon that only
// /debug/pprof/heap, served with --pprof alone, would ever show
// (BENCHMARKS.md "Agent memory", issue 39).
//
// Packages are initialised in dependency order, the first one by import
// path among those ready: this package imports only the runtime, so it
// runs before the Kubernetes, protobuf and xDS libraries' initialisers
// (k8s.io, google.golang.org, ... sort after github.com/membrane-cni).
package heapprofile

import "runtime"

// Rate is the runtime's default profiling rate, which Enable restores.
const Rate = 512 * 1024

func init() { runtime.MemProfileRate = 0 }

// Enable turns heap profiling on (--pprof): allocations from now on are
// sampled, those of the start-up before are not in the profile.
func Enable() { runtime.MemProfileRate = Rate }
