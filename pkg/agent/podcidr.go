package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent/k8s"
)

// IPAM modes (Config.IPAM, --ipam).
const (
	IPAMStatic     = "static"
	IPAMKubernetes = "kubernetes"
)

// maxIPv6RangeBits is the shortest IPv6 range the IPAM bitmap takes
// (2^24 addresses); a node's larger IPv6 pod CIDR (Kubernetes' default
// is a /64) is used from its first address on, for that many addresses.
const maxIPv6RangeBits = 104

// podCIDRRanges waits (bounded by K8s.PodCIDRWait, default 2 min) for
// this node's Node object to have pod CIDRs and makes them the IPAM
// ranges, replacing IPv4Range and IPv6Range. The API is not served
// before, so no CNI ADD is answered with an address from elsewhere.
func podCIDRRanges(cfg *Config, log *slog.Logger) error {
	wait := cfg.K8s.PodCIDRWait
	if wait == 0 {
		wait = 2 * time.Minute
	}
	v4, v6, err := k8s.WaitPodCIDRs(context.Background(), *cfg.K8s, wait, log)
	if err != nil {
		return fmt.Errorf("--ipam %s: %w", IPAMKubernetes, err)
	}
	// The Node's CIDRs as they are: a later change of them is reported.
	k := *cfg.K8s
	k.PodCIDRs = []netip.Prefix{v4, v6}
	cfg.K8s = &k
	if v6.IsValid() && v6.Bits() < maxIPv6RangeBits {
		sub := netip.PrefixFrom(v6.Addr(), maxIPv6RangeBits)
		log.Info("node's IPv6 pod CIDR is larger than the IPAM bitmap; allocating from its start", "pod-cidr", v6, "range", sub)
		v6 = sub
	}
	cfg.IPv4Range, cfg.IPv6Range = v4, v6
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("--ipam %s: node %s's pod CIDRs: %w", IPAMKubernetes, k.NodeName, err)
	}
	return nil
}
