// Command coredns is CoreDNS (github.com/coredns/coredns) with the plugins
// a cluster DNS needs and nothing else: the e2e cluster's kube-dns
// (scripts/coredns.sh builds it, test/e2e packages it as an image).
// Upstream's build links every plugin (cloud DNS providers, tracing, ...);
// this one links the plugins of kubeadm's default Corefile, so it builds
// in a fraction of the time from the same module.
package main

import (
	"github.com/coredns/coredns/coremain"

	// The plugins of kubeadm's default Corefile (dnsserver.Directives,
	// upstream's list, orders them).
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/whoami"
)

func main() {
	coremain.Run()
}
