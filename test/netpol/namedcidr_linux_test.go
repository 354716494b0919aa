package netpol

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// namedCIDRCNPs: x/a may reach 10.233.8.2 only on the named port
// ext-web; x/b, otherwise open, is denied 10.233.8.0/24 but 10.233.8.3
// on ext-web.
const namedCIDRCNPs = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: a-to-cidr-named, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: a}}
  egress:
  - toCIDR: [10.233.8.2/32]
    toPorts: [{ports: [{port: ext-web, protocol: TCP}]}]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: b-deny-cidr-named, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: b}}
  enableDefaultDeny: {egress: false}
  egressDeny:
  - toCIDRSet: [{cidr: 10.233.8.0/24, except: [10.233.8.3/32]}]
    toPorts: [{ports: [{port: ext-web, protocol: TCP}]}]
`

// Issue #36: an egress CIDR peer on a named port, through a real API
// server and the real datapath, toward addresses outside the cluster
// (which declare no ports). As in Cilium the name resolves to the number
// the cluster's pods give it: only z/c names a port ext-web. A CNP's
// toCIDR allow on ext-web lets x/a reach 10.233.8.2 on that number
// only, a NetworkPolicy's ipBlock allow does the same for x/c, and a
// CNP's egressDeny toward a toCIDRSet on ext-web drops x/b's connections
// to 10.233.8.2 on that number only. z/c is replaced by a pod naming
// another number: the allows and the deny move; then by one without
// ext-web: the allows allow nothing and the deny denies nothing.
func TestNamedPortCIDR(t *testing.T) {
	env := kubetest.Require(t)
	w := newWorldOpts(t, "10.232.8.0/24", env, true)
	out := newOutside(t, w, "10.233.8.1", "10.233.8.2", "10.233.8.3")
	e1 := out.Addrs[0] // 10.233.8.2
	for _, a := range out.Addrs {
		for _, port := range []int{80, 81, 82} {
			testutil.EchoServer(t, out.NS, a, port)
		}
	}
	xa, xb, xc, zc := w.pod("x", "a"), w.pod("x", "b"), w.pod("x", "c"), w.pod("z", "c")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	declare := func(ports ...corev1.ContainerPort) {
		t.Helper()
		w.replacePod(ctx, t, zc, append([]corev1.ContainerPort{{Name: "serve-80-tcp", ContainerPort: 80, Protocol: corev1.ProtocolTCP}}, ports...))
	}
	extWeb := func(n int32) corev1.ContainerPort {
		return corev1.ContainerPort{Name: "ext-web", ContainerPort: n, Protocol: corev1.ProtocolTCP}
	}
	declare(extWeb(81))
	w.createCNPs(t, env, namedCIDRCNPs)
	extWebPort := intstr.FromString("ext-web")
	w.createPolicy(t, "x", "c-to-ipblock-named", networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "c"}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
		Egress: []networkingv1.NetworkPolicyEgressRule{{
			To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: e1.String() + "/32"}}},
			Ports: []networkingv1.NetworkPolicyPort{{Port: &extWebPort}},
		}},
	}, xc, true)

	type probe struct {
		src  *worldPod
		dst  int // index in out.Addrs
		port int
	}
	var probes []probe
	for _, src := range []*worldPod{xa, xb, xc} {
		for dst := range out.Addrs {
			for _, port := range []int{80, 81, 82} {
				probes = append(probes, probe{src, dst, port})
			}
		}
	}
	// expect checks every probe (until they all agree, bounded): ext is
	// the number z/c gives ext-web (0: none). x/a and x/c reach only
	// 10.233.8.2 on ext; x/b reaches everything but 10.233.8.2 on ext
	// (10.233.8.3 is its deny's except).
	expect := func(what string, ext int) {
		t.Helper()
		testutil.EventuallyErr(t, what, func() error {
			bad := make([]string, len(probes))
			var wg sync.WaitGroup
			for i, p := range probes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					dst := out.Addrs[p.dst]
					allowed := dst == e1 && p.port == ext
					if p.src == xb {
						allowed = !allowed
					}
					if got := testutil.Exchange(p.src.ns, dst, p.port, probeTimeout) == nil; got != allowed {
						bad[i] = fmt.Sprintf("%s -> %s:%d reached = %v, want %v", p.src, dst, p.port, got, allowed)
					}
				}()
			}
			wg.Wait()
			if bad = slices.DeleteFunc(bad, func(s string) bool { return s == "" }); len(bad) > 0 {
				return fmt.Errorf("%s", strings.Join(bad, "; "))
			}
			return nil
		})
	}
	// waitResolved waits until x/a's and x/b's computed CIDR entries are
	// on ext (none when 0), then until the datapath holds them.
	waitResolved := func(ext int) {
		t.Helper()
		testutil.EventuallyErr(t, fmt.Sprintf("ext-web resolved to %d", ext), func() error {
			for _, c := range []struct {
				p    *worldPod
				deny bool
			}{{xa, false}, {xb, true}, {xc, false}} {
				pol, err := w.c.EndpointPolicy(ctx, strconv.FormatInt(c.p.ep.ID, 10))
				if err != nil {
					return err
				}
				has := func(port int) bool {
					return slices.ContainsFunc(pol.ComputedCIDR, func(e models.CIDRPolicyEntry) bool {
						return e.Direction == "egress" && e.Deny == c.deny && e.Allow && e.Protocol == "TCP" && int(e.Port) == port
					})
				}
				for _, port := range []int{80, 81, 82} {
					if has(port) != (port == ext) {
						return fmt.Errorf("%s computed CIDR entries %+v: want ext-web's on TCP %d only (0: none)", c.p, pol.ComputedCIDR, ext)
					}
				}
			}
			return nil
		})
		w.settle()
	}
	waitResolved(81)
	expect("ext-web is 81", 81)
	// The deny shows in x/b's computed policy: the identity entry of
	// 10.233.8.0/24's CIDR identity denies TCP 81.
	if !slices.ContainsFunc(w.computed(ctx, t, xb), func(e models.PolicyEntry) bool {
		return e.Deny && e.Direction == "egress" && e.Port == 81 && e.Protocol == "TCP"
	}) {
		t.Errorf("x/b computed policy %+v: no egress deny of TCP 81", w.computed(ctx, t, xb))
	}

	declare(extWeb(82))
	waitResolved(82)
	expect("ext-web is 82", 82)

	declare()
	waitResolved(0)
	expect("no pod names ext-web", 0)
}

// namedWorldCNPs: x/a may reach the world only on the named port
// ext-web, x/c any peer only on ext-web (toEntities all); x/b, otherwise
// open, is denied the world on ext-web.
const namedWorldCNPs = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: a-to-world-named, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: a}}
  egress:
  - toEntities: [world]
    toPorts: [{ports: [{port: ext-web, protocol: TCP}]}]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: b-deny-world-named, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: b}}
  enableDefaultDeny: {egress: false}
  egressDeny:
  - toEntities: [world]
    toPorts: [{ports: [{port: ext-web, protocol: TCP}]}]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: c-to-all-named, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: c}}
  egress:
  - toEntities: [all]
    toPorts: [{ports: [{port: ext-web, protocol: TCP}]}]
`

// An egress toEntities world (and all) peer on a named port, through a
// real API server and the real datapath, toward addresses outside the
// cluster (identity world, which declares no ports): as in Cilium the
// name resolves to the number the cluster's pods give it, only z/c's
// here. x/a (toEntities world) and x/c (toEntities all) reach the
// outside addresses on that number only; x/b's egressDeny toward world
// drops its connections on that number only. z/c is replaced by a pod
// naming another number: the allows and the deny move; then by one
// without ext-web: the allows allow nothing and the deny denies nothing.
func TestNamedPortWorld(t *testing.T) {
	env := kubetest.Require(t)
	w := newWorldOpts(t, "10.232.9.0/24", env, true)
	out := newOutside(t, w, "10.233.9.1", "10.233.9.2", "10.233.9.3")
	for _, a := range out.Addrs {
		for _, port := range []int{80, 81, 82} {
			testutil.EchoServer(t, out.NS, a, port)
		}
	}
	xa, xb, xc, zc := w.pod("x", "a"), w.pod("x", "b"), w.pod("x", "c"), w.pod("z", "c")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	declare := func(ports ...corev1.ContainerPort) {
		t.Helper()
		w.replacePod(ctx, t, zc, append([]corev1.ContainerPort{{Name: "serve-80-tcp", ContainerPort: 80, Protocol: corev1.ProtocolTCP}}, ports...))
	}
	extWeb := func(n int32) corev1.ContainerPort {
		return corev1.ContainerPort{Name: "ext-web", ContainerPort: n, Protocol: corev1.ProtocolTCP}
	}
	declare(extWeb(81))
	w.createCNPs(t, env, namedWorldCNPs)

	type probe struct {
		src  *worldPod
		dst  netip.Addr
		port int
	}
	var probes []probe
	for _, src := range []*worldPod{xa, xb, xc} {
		for _, dst := range out.Addrs {
			for _, port := range []int{80, 81, 82} {
				probes = append(probes, probe{src, dst, port})
			}
		}
	}
	// expect checks every probe (until they all agree, bounded): ext is
	// the number z/c gives ext-web (0: none). x/a and x/c reach the
	// outside only on ext, x/b everywhere but on ext.
	expect := func(what string, ext int) {
		t.Helper()
		testutil.EventuallyErr(t, what, func() error {
			bad := make([]string, len(probes))
			var wg sync.WaitGroup
			for i, p := range probes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					allowed := p.port == ext
					if p.src == xb {
						allowed = !allowed
					}
					if got := testutil.Exchange(p.src.ns, p.dst, p.port, probeTimeout) == nil; got != allowed {
						bad[i] = fmt.Sprintf("%s -> %s:%d reached = %v, want %v", p.src, p.dst, p.port, got, allowed)
					}
				}()
			}
			wg.Wait()
			if bad = slices.DeleteFunc(bad, func(s string) bool { return s == "" }); len(bad) > 0 {
				return fmt.Errorf("%s", strings.Join(bad, "; "))
			}
			return nil
		})
	}
	// waitResolved waits until x/a's, x/b's (deny) and x/c's computed
	// entries toward the world identity are on ext (none when 0), then
	// until the datapath holds them.
	waitResolved := func(ext int) {
		t.Helper()
		testutil.EventuallyErr(t, fmt.Sprintf("ext-web resolved to %d", ext), func() error {
			for _, c := range []struct {
				p    *worldPod
				deny bool
			}{{xa, false}, {xb, true}, {xc, false}} {
				pol, err := w.c.EndpointPolicy(ctx, strconv.FormatInt(c.p.ep.ID, 10))
				if err != nil {
					return err
				}
				has := func(port int) bool {
					return slices.ContainsFunc(pol.Computed, func(e models.PolicyEntry) bool {
						return e.Identity == uint32(identity.ReservedWorld) && e.Direction == "egress" && e.Deny == c.deny && e.Protocol == "TCP" && int(e.Port) == port
					})
				}
				for _, port := range []int{80, 81, 82} {
					if has(port) != (port == ext) {
						return fmt.Errorf("%s computed entries %+v: want world's on TCP %d only (0: none)", c.p, pol.Computed, ext)
					}
				}
			}
			return nil
		})
		w.settle()
	}
	waitResolved(81)
	expect("ext-web is 81", 81)

	declare(extWeb(82))
	waitResolved(82)
	expect("ext-web is 82", 82)

	declare()
	waitResolved(0)
	expect("no pod names ext-web", 0)
}
