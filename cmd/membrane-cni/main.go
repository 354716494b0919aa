// Command membrane-cni is Membrane's CNI plugin, executed by the
// container runtime (conflist type "membrane-cni") with CNI_COMMAND ADD,
// DEL, CHECK, STATUS, GC or VERSION. The logic lives in pkg/clients/cni.
package main

import (
	"runtime"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/cni/skel"

	"github.com/membrane-cni/membrane/pkg/clients/cni"
)

func main() {
	cni.ProcessStart = time.Now()
	// One Go processor: the plugin's work is a sequence of syscalls
	// with one HTTP call alongside, and a second processor only brought
	// its own allocation caches (fresh spans: about 20 more page faults
	// per ADD) and wakeups. Measured in BENCHMARKS.md ("CNI plugin and
	// host path"): 3-8% less plugin CPU per ADD, ADD p50 at 8 concurrent
	// 0.56-0.67 against 0.59-0.73 of ptp in three A/B runs.
	runtime.GOMAXPROCS(1)
	skel.PluginMainFuncs(cni.Funcs(), cni.VersionInfo(), cni.About)
}
