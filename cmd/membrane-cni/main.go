// Command membrane-cni is Membrane's CNI plugin, executed by the
// container runtime (conflist type "membrane-cni") with CNI_COMMAND ADD,
// DEL, CHECK, STATUS, GC or VERSION. The logic lives in pkg/clients/cni.
package main

import (
	"time"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/membrane-cni/membrane/pkg/clients/cni"
)

func main() {
	cni.ProcessStart = time.Now()
	skel.PluginMainFuncs(cni.Funcs(), cni.VersionInfo(), cni.About)
}
