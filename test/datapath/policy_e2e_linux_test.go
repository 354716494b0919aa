package datapath_test

import (
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
	"github.com/membrane-cni/membrane/test/policyscenario"
)

// policyPod is a pod made by the CNI plugin, with its endpoint and its
// addresses (IPv4 then IPv6, those the agent serves).
type policyPod struct {
	*nodeharness.Pod
	ips []netip.Addr
	ep  *models.Endpoint
}

// deniedDial bounds a connection attempt that policy drops (the SYN
// never gets an answer): a bound for the negative check, not a timing
// assertion.
const deniedDial = 1500 * time.Millisecond

// addPolicyPod runs CNI ADD for a pod and labels its endpoint, as the
// agent's Kubernetes watcher would from the pod's labels.
func addPolicyPod(t *testing.T, e *nodeharness.Node, c *client.Client, name string, labels ...string) *policyPod {
	t.Helper()
	p := e.NewPod(name)
	res := e.MustAdd(p)
	pp := &policyPod{Pod: p}
	for _, ipc := range res.IPs {
		ip, ok := netip.AddrFromSlice(ipc.Address.IP)
		if !ok {
			t.Fatalf("pod %s: bad address in %v", name, res)
		}
		pp.ips = append(pp.ips, ip.Unmap())
	}
	if len(pp.ips) == 0 {
		t.Fatalf("pod %s: no address in %v", name, res)
	}
	ep, err := c.EndpointPatchLabels(context.Background(), "container-id:"+p.RT.ContainerID, labels, nil)
	if err != nil {
		t.Fatalf("label pod %s: %v", name, err)
	}
	pp.ep = ep
	return pp
}

// ip returns the pod's address of dst's family.
func (p *policyPod) ip(like netip.Addr) netip.Addr {
	for _, ip := range p.ips {
		if ip.Is4() == like.Is4() {
			return ip
		}
	}
	return netip.Addr{}
}

// listen serves an echo on port of each of the pod's addresses.
func (p *policyPod) listen(t *testing.T, port int) {
	t.Helper()
	for _, ip := range p.ips {
		testutil.EchoServer(t, p.NS, ip, port)
	}
}

// talk connects from p to dst's address dstIP on port and exchanges a
// message both ways: the request passes dst's ingress policy and the
// reply p's (conntrack).
func (p *policyPod) talk(dstIP netip.Addr, port int, timeout time.Duration) error {
	return testutil.Exchange(p.NS, dstIP, port, timeout)
}

func podName(p *policyPod) string { return p.RT.Args[2][1] }

// mustTalk checks from -> to:port over every family.
func mustTalk(t *testing.T, from, to *policyPod, port int) {
	t.Helper()
	for _, ip := range to.ips {
		if err := from.talk(ip, port, 5*time.Second); err != nil {
			t.Errorf("%s -> %s [%s]:%d: %v; want it to pass", podName(from), podName(to), ip, port, err)
		}
	}
}

// mustNotTalk checks from -> to:port is dropped over every family.
func mustNotTalk(t *testing.T, from, to *policyPod, port int) {
	t.Helper()
	for _, ip := range to.ips {
		if err := from.talk(ip, port, deniedDial); err == nil {
			t.Errorf("%s -> %s [%s]:%d passed; want it dropped", podName(from), podName(to), ip, port)
		}
	}
}

// dropWatch collects the agent's datapath-drop events.
type dropWatch struct {
	mu    sync.Mutex
	drops []events.Event
}

// watchDrops follows GET /v1/events?type=datapath-drop from the first
// event the agent still holds (so nothing published before the stream
// opened is missed) until the test ends.
func watchDrops(t *testing.T, c *client.Client) *dropWatch {
	t.Helper()
	w := &dropWatch{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		q := url.Values{"type": {string(events.DatapathDrop)}, "since": {"1"}}
		_ = c.Events(ctx, q, func(ev events.Event) bool {
			w.mu.Lock()
			w.drops = append(w.drops, ev)
			w.mu.Unlock()
			return true
		})
	}()
	return w
}

// wait waits (bounded) for a drop event matching want.
func (w *dropWatch) wait(t *testing.T, what string, want func(events.Event) bool) events.Event {
	t.Helper()
	var found events.Event
	testutil.EventuallyErr(t, "a drop event for "+what, func() error {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, ev := range w.drops {
			if ev.Type == events.DatapathDrop && ev.Drop != nil && want(ev) {
				found = ev
				return nil
			}
		}
		return fmt.Errorf("none among %d events", len(w.drops))
	})
	return found
}

// deniedPackets is endpoint id's policy-denied ingress drop counter from
// GET /v1/endpoint/{id}/policy.
func deniedPackets(t *testing.T, c *client.Client, id int64) uint64 {
	t.Helper()
	p, err := c.EndpointPolicy(context.Background(), strconv.FormatInt(id, 10))
	if err != nil {
		t.Fatal(err)
	}
	if p.DropsError != "" {
		t.Fatalf("endpoint %d drop counters: %s", id, p.DropsError)
	}
	for _, d := range p.Drops {
		if d.Reason == "policy-denied" && d.Direction == "ingress" {
			return d.Packets
		}
	}
	return 0
}

// TestPolicyEndToEnd is issue #4's end-to-end test: three pods made by
// the CNI plugin on a dual-stack agent with the Linux datapath and its
// BPF programs, policy imported through the API, real TCP between the
// pods over IPv4 and IPv6 (every check runs on both families).
func TestPolicyEndToEnd(t *testing.T) {
	e := newEnvStack(t, "10.231.0.0/24", "fd00:231::/120")
	startAgent(e, nil)
	c := e.Client()
	a := addPolicyPod(t, e, c, "pod-a", "k8s:app=a", "k8s:instance=a")
	b := addPolicyPod(t, e, c, "pod-b", "k8s:app=b", "k8s:instance=b")
	cc := addPolicyPod(t, e, c, "pod-c", "k8s:app=c", "k8s:instance=c")
	b.listen(t, 8080)
	b.listen(t, 8081)
	a.listen(t, 9000)
	idA := identity.NumericIdentity(a.ep.Identity.ID)
	drops := watchDrops(t, c)

	t.Run("no policy: everything passes", func(t *testing.T) {
		mustTalk(t, a, b, 8080)
		mustTalk(t, a, b, 8081)
		mustTalk(t, cc, b, 8080)
		mustTalk(t, b, a, 9000)
	})
	bEnforced := func(t *testing.T, what string, allowed ...identity.NumericIdentity) {
		t.Helper()
		policyscenario.WaitRealized(t, c, b.ep.ID, what, func(m *policy.MapState) bool {
			for _, id := range allowed {
				if !m.Allows(id, 8080, policy.ProtoTCP, policy.Ingress) {
					return false
				}
			}
			return m.Enforced(policy.Ingress)
		})
	}
	t.Run("A may reach B on TCP 8080 only", func(t *testing.T) {
		if _, err := c.PolicyImport(context.Background(), []byte(policyscenario.CNPAllowAToB), client.ContentTypeYAML); err != nil {
			t.Fatal(err)
		}
		bEnforced(t, "A allowed into B on 8080", idA)
		before := deniedPackets(t, c, b.ep.ID)
		mustTalk(t, a, b, 8080)
		mustNotTalk(t, a, b, 8081)
		mustNotTalk(t, cc, b, 8080)
		mustTalk(t, b, a, 9000) // B's egress and A's ingress are not enforced
		// Both denied attempts reach the operators: drop events for B's
		// endpoint and B's counters.
		for _, bIP := range b.ips {
			for _, d := range []struct {
				from *policyPod
				port uint16
			}{{a, 8081}, {cc, 8080}} {
				src := d.from.ip(bIP)
				what := fmt.Sprintf("%s -> B %s:%d", src, bIP, d.port)
				ev := drops.wait(t, what, func(ev events.Event) bool {
					return ev.Endpoint == uint16(b.ep.ID) && ev.Drop.Src == src.String() && ev.Drop.DstPort == d.port
				})
				want := events.Drop{Reason: "policy-denied", Direction: "ingress", Src: src.String(), Dst: bIP.String(),
					SrcPort: ev.Drop.SrcPort, DstPort: d.port, Proto: 6, PeerIdentity: uint32(d.from.ep.Identity.ID), Bytes: ev.Drop.Bytes}
				if *ev.Drop != want || ev.Drop.SrcPort == 0 || ev.Drop.Bytes == 0 {
					t.Errorf("drop event for %s = %+v, want %+v", what, *ev.Drop, want)
				}
			}
		}
		if after := deniedPackets(t, c, b.ep.ID); after < before+2*uint64(len(b.ips)) {
			t.Errorf("B's policy-denied ingress counter went from %d to %d; want at least %d more", before, after, 2*len(b.ips))
		}
		drops.mu.Lock()
		defer drops.mu.Unlock()
		for _, ev := range drops.drops {
			for _, ip := range a.ips {
				if ev.Endpoint == uint16(b.ep.ID) && ev.Drop != nil && ev.Drop.Src == ip.String() && ev.Drop.DstPort == 8080 {
					t.Errorf("allowed A -> B:8080 reported dropped: %+v", *ev.Drop)
				}
			}
		}
	})
	t.Run("deleting the policy restores traffic", func(t *testing.T) {
		if _, err := c.PolicyDelete(context.Background(), "default/a-to-b"); err != nil {
			t.Fatal(err)
		}
		policyscenario.WaitRealized(t, c, b.ep.ID, "allow-all", func(m *policy.MapState) bool { return !m.Enforced(policy.Ingress) })
		mustTalk(t, cc, b, 8080)
		mustTalk(t, a, b, 8081)
	})
	t.Run("relabelling C to app=a lets it in", func(t *testing.T) {
		if _, err := c.PolicyImport(context.Background(), []byte(policyscenario.CNPAllowAToB), client.ContentTypeYAML); err != nil {
			t.Fatal(err)
		}
		bEnforced(t, "the policy back", idA)
		mustNotTalk(t, cc, b, 8080)
		ep, err := c.EndpointPatchLabels(context.Background(), fmt.Sprint(cc.ep.ID), []string{"k8s:app=a"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		bEnforced(t, "C's new identity allowed into B", idA, identity.NumericIdentity(ep.Identity.ID))
		mustTalk(t, cc, b, 8080)
		mustNotTalk(t, cc, b, 8081)
	})
}
