package sim

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// Checks of a settled agent beyond the index (checks.go): each
// endpoint's realised policy against its computed one and the ipcache
// against the endpoints, through the API (with --policy-churn or the
// linux datapath), and the kernel objects of the linux datapath.

// nsLabel is the namespace label membrane-cni gives every pod; the sim's
// pods carry it with either driver, so that namespaced policies select them.
const nsLabel = "k8s:io.kubernetes.pod.namespace=" + simNamespace

// Invariants of the end checks, as named in reports.
const (
	// invPolicy: an endpoint's realised policy (datapath policy map and
	// enforcement) differs from the one computed for it.
	invPolicy = "policy-not-realized"
	// invIPCache: the ipcache does not map a live endpoint's address to
	// its identity, or maps an address no endpoint has.
	invIPCache = "ipcache-disagrees"
	// invKernel: a live endpoint's host veth or BPF pins are missing, or
	// lxc veths or pin directories remain that belong to no endpoint
	// (--datapath linux).
	invKernel = "kernel-state-disagrees"
)

// endCheckWait bounds how long the end checks wait for state that
// converges after quiescence (policy regenerations triggered late, the
// kernel removing a deleted pod's netns, the garbage collector's passes).
const endCheckWait = 15 * time.Second

// kernelChecker is a Target whose kernel state can be checked.
type kernelChecker interface {
	kernelFindings(s *Snapshot) []finding
}

// endChecks runs the API and kernel checks, polling until they pass or
// endCheckWait passes; it returns the findings of the last attempt.
func (e *engine) endChecks(ctx context.Context, s *Snapshot) []finding {
	kc, linux := e.tgt.(kernelChecker)
	api := e.sc.PolicyChurn > 0 || linux
	deadline := time.Now().Add(endCheckWait)
	for {
		var out []finding
		if api {
			out = append(out, e.policyFindings(ctx, s)...)
			out = append(out, e.policySetFindings(ctx)...) // policychurn.go
		}
		if linux {
			out = append(out, kc.kernelFindings(s)...)
		}
		if len(out) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return out
		}
		time.Sleep(200 * time.Millisecond)
		if fresh, err := e.tgt.Snapshot(ctx, false); err == nil {
			s = fresh
		}
	}
}

// policyFindings compares, for every endpoint, GET /v1/endpoint/{id}/policy's
// realised entries and enforcement with the computed ones, and GET
// /v1/ipcache with the endpoints' addresses and identities.
func (e *engine) policyFindings(ctx context.Context, s *Snapshot) []finding {
	c := e.tgt.Client()
	var out []finding
	for _, ep := range s.Endpoints {
		pol, err := c.EndpointPolicy(ctx, strconv.Itoa(int(ep.ID)))
		if err != nil {
			out = append(out, finding{invPolicy, "endpoint " + strconv.Itoa(int(ep.ID)), ep.ContainerID,
				fmt.Sprintf("%s: GET policy: %v", epName(ep), err)})
			continue
		}
		if msg := policyDiff(pol); msg != "" {
			out = append(out, finding{invPolicy, "endpoint " + strconv.Itoa(int(ep.ID)), ep.ContainerID, epName(ep) + ": " + msg})
		}
	}
	entries, err := c.IPCache(ctx)
	if err != nil {
		return append(out, finding{invIPCache, "ipcache", "", "GET /v1/ipcache: " + err.Error()})
	}
	return append(out, ipcacheFindings(s.Endpoints, entries)...)
}

// policyDiff says how an endpoint's realised policy differs from the
// computed one ("" if it does not).
func policyDiff(p *models.EndpointPolicy) string {
	if p.RealizedError != "" {
		return "realised policy unreadable: " + p.RealizedError
	}
	if p.IngressEnforced != p.RealizedIngressEnforced || p.EgressEnforced != p.RealizedEgressEnforced {
		return fmt.Sprintf("enforcement computed ingress %v egress %v, realised ingress %v egress %v",
			p.IngressEnforced, p.EgressEnforced, p.RealizedIngressEnforced, p.RealizedEgressEnforced)
	}
	key := func(e models.PolicyEntry) string {
		return fmt.Sprintf("%d/%d/%s/%s/%s/%v", e.Identity, e.Port, e.ICMPType, e.Protocol, e.Direction, e.Deny)
	}
	computed := make([]string, 0, len(p.Computed))
	for _, c := range p.Computed {
		computed = append(computed, key(c))
	}
	realized := make([]string, 0, len(p.Realized))
	for _, r := range p.Realized {
		realized = append(realized, key(r.PolicyEntry))
	}
	cidr := func(e models.CIDRPolicyEntry) string {
		return fmt.Sprintf("%s/%d/%s/%s/%v/%v", e.CIDR, e.Port, e.Protocol, e.Direction, e.Deny, e.Allow)
	}
	for _, c := range p.ComputedCIDR {
		computed = append(computed, cidr(c))
	}
	for _, r := range p.RealizedCIDR {
		realized = append(realized, cidr(r.CIDRPolicyEntry))
	}
	slices.Sort(computed)
	slices.Sort(realized)
	if slices.Equal(computed, realized) {
		return ""
	}
	return fmt.Sprintf("policy revision %d: computed %d entries %v, realised %d entries %v",
		p.PolicyRevision, len(computed), head(computed), len(realized), head(realized))
}

// head keeps violation messages short.
func head(s []string) []string {
	if len(s) > 8 {
		return append(slices.Clip(s[:8]), "...")
	}
	return s
}

// ipcacheFindings: every endpoint address maps to the endpoint's identity
// (source endpoint), and no endpoint entry names an address no endpoint has.
func ipcacheFindings(eps []*endpoint.Endpoint, entries []models.IPCacheEntry) []finding {
	byPrefix := make(map[netip.Prefix]models.IPCacheEntry, len(entries))
	for _, en := range entries {
		if p, err := netip.ParsePrefix(en.CIDR); err == nil {
			byPrefix[p] = en
		}
	}
	var out []finding
	owned := map[netip.Prefix]bool{}
	for _, ep := range eps {
		for _, ip := range []netip.Addr{ep.IPv4, ep.IPv6} {
			if !ip.IsValid() {
				continue
			}
			p := netip.PrefixFrom(ip, ip.BitLen())
			owned[p] = true
			en, ok := byPrefix[p]
			switch {
			case !ok:
				out = append(out, finding{invIPCache, "ip " + ip.String(), ep.ContainerID,
					fmt.Sprintf("%s: its address %s is not in the ipcache", epName(ep), ip)})
			case en.Identity != uint32(ep.Identity):
				out = append(out, finding{invIPCache, "ip " + ip.String(), ep.ContainerID,
					fmt.Sprintf("%s: ipcache maps %s to identity %d (source %s), the endpoint has %d", epName(ep), ip, en.Identity, en.Source, ep.Identity)})
			}
		}
	}
	for p, en := range byPrefix {
		if en.Source == "endpoint" && !owned[p] {
			out = append(out, finding{invIPCache, "ip " + p.Addr().String(), "",
				fmt.Sprintf("ipcache maps %s to identity %d for an endpoint, but no endpoint has that address", p, en.Identity)})
		}
	}
	return out
}

// hookLeftToGC counts the endpoints whose datapath removal the agent gave up on.
func (t *inProcess) hookLeftToGC() int { return len(t.hook.leftToGC()) }
