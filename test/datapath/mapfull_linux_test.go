package datapath_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/datapath"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
	"github.com/membrane-cni/membrane/test/policyscenario"
)

// smallPolicyMap is --policy-map-max in the map-full tests: 14 policy
// entries fit (two are the enforcement flags).
const smallPolicyMap = 16

// ingressPolicy is a CiliumNetworkPolicy "b-in" selecting app=b that
// lets app=from in on TCP ports.
func ingressPolicy(from string, ports ...int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: b-in
  namespace: default
spec:
  endpointSelector:
    matchLabels:
      app: b
  ingress:
  - fromEndpoints:
    - matchLabels:
        k8s:app: %s
    toPorts:
    - ports:
`, from)
	for _, p := range ports {
		fmt.Fprintf(&b, "      - port: \"%d\"\n        protocol: TCP\n", p)
	}
	return []byte(b.String())
}

// portRange is n ports from first.
func portRange(first, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = first + i
	}
	return out
}

// metricValue is the agent's counter or gauge series name{label="value"}
// (0 if absent), read from its registry.
func metricValue(t *testing.T, e *nodeharness.Node, name, label, value string) float64 {
	t.Helper()
	mfs, err := e.Agent.Metrics().Registry().Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					if c := m.GetCounter(); c != nil {
						return c.GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// TestPolicyMapFull is issue #38's "kernel map full" for an endpoint's
// policy map, on a real agent with --policy-map-max 16: a policy whose
// entries do not fit fails closed (the endpoint denies every new
// connection, never keeps its more permissive old policy), says so in
// the endpoint's status and membrane_bpf_map_full_total{map="policy"},
// and recovers by itself when the policy shrinks; a change whose old and
// new entries do not fit together (but the new ones alone do) is
// realised exactly, never left halfway.
func TestPolicyMapFull(t *testing.T) {
	e := newEnv(t, "10.238.0.0/24")
	startAgent(e, func(c *agent.Config) { c.Linux.Maps.PolicyMax = smallPolicyMap })
	c := e.Client()
	a := addPolicyPod(t, e, c, "pod-a", "k8s:app=a")
	b := addPolicyPod(t, e, c, "pod-b", "k8s:app=b")
	cc := addPolicyPod(t, e, c, "pod-c", "k8s:app=c")
	b.listen(t, 8080)
	importPolicy := func(t *testing.T, doc []byte) {
		t.Helper()
		if _, err := c.PolicyImport(context.Background(), doc, client.ContentTypeYAML); err != nil {
			t.Fatal(err)
		}
	}
	// B's state changes, as GET /v1/events streams them.
	var evMu sync.Mutex
	var stateEvents []events.Event
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		_ = c.Events(ctx, url.Values{"type": {string(events.EndpointStateChanged)}, "since": {"1"}}, func(ev events.Event) bool {
			if ev.Endpoint == uint16(b.ep.ID) {
				evMu.Lock()
				stateEvents = append(stateEvents, ev)
				evMu.Unlock()
			}
			return true
		})
	}()
	idA, idC := identity.NumericIdentity(a.ep.Identity.ID), identity.NumericIdentity(cc.ep.Identity.ID)
	allows := func(m *policy.MapState, id identity.NumericIdentity) bool {
		return m.Allows(id, 8080, policy.ProtoTCP, policy.Ingress)
	}

	t.Run("A and C may reach B", func(t *testing.T) {
		importPolicy(t, ingressPolicy("a", 8080))
		// Two selectors: one policy each, as the rules are one per peer.
		importPolicy(t, []byte(strings.Replace(string(ingressPolicy("c", 8080)), "name: b-in", "name: b-in-c", 1)))
		policyscenario.WaitRealized(t, c, b.ep.ID, "A and C allowed into B", func(m *policy.MapState) bool {
			return allows(m, idA) && allows(m, idC)
		})
		mustTalk(t, a, b, 8080)
		mustTalk(t, cc, b, 8080)
	})
	before := metricValue(t, e, "membrane_bpf_map_full_total", "map", "policy")
	t.Run("a policy that does not fit fails closed", func(t *testing.T) {
		// C's rule goes, A's grows to 20 ports: 20 entries, 14 fit.
		if _, err := c.PolicyDelete(context.Background(), "default/b-in-c"); err != nil {
			t.Fatal(err)
		}
		importPolicy(t, ingressPolicy("a", append([]int{8080}, portRange(9001, 19)...)...))
		testutil.EventuallyErr(t, "B's status naming the full policy map", func() error {
			ep, err := c.EndpointGet(context.Background(), fmt.Sprint(b.ep.ID))
			if err != nil {
				return err
			}
			if !strings.Contains(ep.LastError, "policy map full") || ep.State == "ready" {
				return fmt.Errorf("state %s, last error %q", ep.State, ep.LastError)
			}
			t.Logf("B: state %s, last error %q", ep.State, ep.LastError)
			return nil
		})
		testutil.EventuallyErr(t, "an endpoint-state-changed event of B naming the full policy map", func() error {
			evMu.Lock()
			defer evMu.Unlock()
			for _, ev := range stateEvents {
				if strings.Contains(ev.Message, "policy map full") {
					return nil
				}
			}
			return fmt.Errorf("none among %d", len(stateEvents))
		})
		m := policyscenario.WaitRealized(t, c, b.ep.ID, "deny-all", func(m *policy.MapState) bool {
			return m.Enforced(policy.Ingress) && m.Enforced(policy.Egress) && len(m.Allow) == 0
		})
		t.Logf("realised while full: %+v", m)
		// C's old allowance is gone, and A's new one is not there.
		mustNotTalk(t, cc, b, 8080)
		mustNotTalk(t, a, b, 8080)
		if after := metricValue(t, e, "membrane_bpf_map_full_total", "map", "policy"); after <= before {
			t.Errorf(`membrane_bpf_map_full_total{map="policy"} %v -> %v, want it to grow`, before, after)
		}
	})
	t.Run("the policy shrinks: B recovers by itself", func(t *testing.T) {
		start := time.Now()
		importPolicy(t, ingressPolicy("a", append([]int{8080}, portRange(9101, 9)...)...))
		policyscenario.WaitRealized(t, c, b.ep.ID, "A's 10 ports", func(m *policy.MapState) bool {
			return allows(m, idA) && len(m.Allow) == 10 && !m.Enforced(policy.Egress)
		})
		testutil.EventuallyErr(t, "B ready without an error", func() error {
			ep, err := c.EndpointGet(context.Background(), fmt.Sprint(b.ep.ID))
			if err != nil {
				return err
			}
			if ep.State != "ready" || ep.LastError != "" {
				return fmt.Errorf("state %s, last error %q", ep.State, ep.LastError)
			}
			return nil
		})
		t.Logf("B realised the shrunk policy and was ready %v after the import", time.Since(start))
		mustTalk(t, a, b, 8080)
		mustNotTalk(t, cc, b, 8080)
	})
	t.Run("old and new entries do not fit together", func(t *testing.T) {
		// 10 entries held, 10 others wanted: 22 with the flags while
		// both are there, 16 fit.
		importPolicy(t, ingressPolicy("c", append([]int{8080}, portRange(9201, 9)...)...))
		policyscenario.WaitRealized(t, c, b.ep.ID, "C's 10 ports only", func(m *policy.MapState) bool {
			return allows(m, idC) && !allows(m, idA) && len(m.Allow) == 10
		})
		mustTalk(t, cc, b, 8080)
		mustNotTalk(t, a, b, 8080)
		ep, err := c.EndpointGet(context.Background(), fmt.Sprint(b.ep.ID))
		if err != nil {
			t.Fatal(err)
		}
		if ep.LastError != "" {
			t.Errorf("B's last error %q after a change whose new policy fits", ep.LastError)
		}
	})
}

// ctEntriesOfPort counts the conntrack entries (pinned at <bpffs>/ct)
// of TCP connections from or to port.
func ctEntriesOfPort(t *testing.T, e *nodeharness.Node, port uint16) int {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(e.BPFFS, "ct"), nil)
	if err != nil {
		t.Fatalf("open conntrack map: %v", err)
	}
	defer m.Close()
	var k bpf.EndpointCtKey
	var v bpf.EndpointCtValue
	n := 0
	p := binary.BigEndian.Uint16(binary.NativeEndian.AppendUint16(nil, port)) // network order in memory
	it := m.Iterate()
	for it.Next(&k, &v) {
		if k.Proto == 6 && (k.Sport == p || k.Dport == p) {
			n++
		}
	}
	if err := it.Err(); err != nil {
		t.Fatalf("read conntrack map: %v", err)
	}
	return n
}

// udpBurst sends n UDP datagrams from p on every CPU the test may use,
// each from a new socket (a new source port: a new connection for
// conntrack) to dst:9. Every CPU: the kernel's LRU hash keeps each CPU's
// recent inserts on that CPU's own pending list, which only that CPU's
// next inserts evict from, so an established connection whose entries
// were made on one CPU survives any number of new connections made on
// another (the veth's programs run on the sender's CPU).
func udpBurst(t *testing.T, p *policyPod, dst netip.Addr, n int) {
	t.Helper()
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		t.Fatal(err)
	}
	for cpu := range 1024 {
		if !all.IsSet(cpu) {
			continue
		}
		err := p.NS.Do(func() error {
			// NS.Do runs fn on a locked thread of its own (which exits
			// after); the affinity is put back all the same.
			var one unix.CPUSet
			one.Set(cpu)
			if err := unix.SchedSetaffinity(0, &one); err != nil {
				return err
			}
			defer func() { _ = unix.SchedSetaffinity(0, &all) }()
			for range n {
				c, err := net.Dial("udp", net.JoinHostPort(dst.String(), "9"))
				if err != nil {
					return err
				}
				_, _ = c.Write([]byte("fill"))
				c.Close()
			}
			return nil
		})
		if err != nil {
			t.Fatalf("udp burst from %s on CPU %d: %v", podName(p), cpu, err)
		}
	}
}

// firstCPU is the lowest CPU the test may run on.
func firstCPU(t *testing.T) int {
	t.Helper()
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		t.Fatal(err)
	}
	for cpu := range 1024 {
		if all.IsSet(cpu) {
			return cpu
		}
	}
	t.Fatal("no CPU in the affinity mask")
	return 0
}

// egressDropped is endpoint id's policy-denied egress drop counter.
func egressDropped(t *testing.T, c *client.Client, id int64) uint64 {
	t.Helper()
	p, err := c.EndpointPolicy(context.Background(), fmt.Sprint(id))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range p.Drops {
		if d.Reason == "policy-denied" && d.Direction == "egress" {
			return d.Packets
		}
	}
	return 0
}

// TestConntrackFull is issue #38's "kernel map full" for conntrack, on a
// real agent with --ct-max 1024: new connections from another pod fill
// the table, an LRU, which evicts an established connection's entries.
// Its packets are then decided by policy again, never passed as replies
// blindly: the server's data, which only a conntrack entry lets out of
// its egress-enforced pod, is dropped (policy-denied, egress) until the
// client, whom policy allows, sends again and conntrack holds the
// connection anew; then the data arrives (TCP retransmits it).
func TestConntrackFull(t *testing.T) {
	e := newEnv(t, "10.239.0.0/24")
	startAgent(e, func(c *agent.Config) { c.Linux.Maps.CTMax = datapath.MinCTMax })
	c := e.Client()
	a := addPolicyPod(t, e, c, "pod-a", "k8s:app=a")
	b := addPolicyPod(t, e, c, "pod-b", "k8s:app=b")
	filler := addPolicyPod(t, e, c, "pod-f", "k8s:app=f")
	d := addPolicyPod(t, e, c, "pod-d", "k8s:app=d")
	for _, doc := range []string{string(ingressPolicy("a", 8080)), `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: b-out
  namespace: default
spec:
  endpointSelector:
    matchLabels:
      app: b
  egress:
  - toEndpoints:
    - matchLabels:
        k8s:app: nothing
`} {
		if _, err := c.PolicyImport(context.Background(), []byte(doc), client.ContentTypeYAML); err != nil {
			t.Fatal(err)
		}
	}
	idA := identity.NumericIdentity(a.ep.Identity.ID)
	policyscenario.WaitRealized(t, c, b.ep.ID, "A into B on 8080, B's egress enforced", func(m *policy.MapState) bool {
		return m.Allows(idA, 8080, policy.ProtoTCP, policy.Ingress) && m.Enforced(policy.Egress)
	})
	bIP := b.ips[0]
	var ln net.Listener
	if err := b.NS.Do(func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(bIP.String(), "8080"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var cl net.Conn
	if err := a.NS.Do(func() (err error) {
		// The connection's entries are made on the first CPU (the
		// handshake runs on the dialer's), the case udpBurst's every-CPU
		// fill exists for.
		var first unix.CPUSet
		first.Set(firstCPU(t))
		if err := unix.SchedSetaffinity(0, &first); err != nil {
			return err
		}
		cl, err = net.DialTimeout("tcp", net.JoinHostPort(bIP.String(), "8080"), 5*time.Second)
		return err
	}); err != nil {
		t.Fatalf("A -> B:8080: %v", err)
	}
	t.Cleanup(func() { cl.Close() })
	srv, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	exchange := func(from, to net.Conn, msg string, wait time.Duration) error {
		if _, err := from.Write([]byte(msg)); err != nil {
			return err
		}
		_ = to.SetReadDeadline(time.Now().Add(wait))
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(to, got); err != nil {
			return err
		}
		if string(got) != msg {
			return fmt.Errorf("read %q, want %q", got, msg)
		}
		return nil
	}
	if err := exchange(cl, srv, "hello", 5*time.Second); err != nil {
		t.Fatalf("A -> B established: %v", err)
	}
	if err := exchange(srv, cl, "reply", 5*time.Second); err != nil {
		t.Fatalf("B -> A reply: %v", err)
	}
	if n := ctEntriesOfPort(t, e, 8080); n == 0 {
		t.Fatal("no conntrack entry of the established connection")
	}

	// New connections from the filler pod (no policy) to D fill the
	// table until the established connection's entries are evicted.
	for i := 0; ctEntriesOfPort(t, e, 8080) > 0; i++ {
		if i == 20 {
			t.Fatalf("the established connection's conntrack entries survived %d new connections in a table of %d", i*datapath.MinCTMax, datapath.MinCTMax)
		}
		udpBurst(t, filler, d.ips[0], datapath.MinCTMax)
	}

	// The table's fill shows in the metrics.
	if n, size := metricValue(t, e, "membrane_bpf_map_entries", "map", "ct"), metricValue(t, e, "membrane_bpf_map_max_entries", "map", "ct"); size != datapath.MinCTMax || n < size/2 {
		t.Errorf(`membrane_bpf_map_entries{map="ct"} %v of membrane_bpf_map_max_entries %v, want a full table of %d`, n, size, datapath.MinCTMax)
	}
	before := egressDropped(t, c, b.ep.ID)
	// The server's data is no reply conntrack knows: B's egress policy
	// (nothing allowed) decides, and drops it.
	if err := exchange(srv, cl, "push", deniedDial); err == nil {
		t.Fatal("B -> A data passed after its conntrack entries were evicted; want B's egress policy to drop it")
	}
	if after := egressDropped(t, c, b.ep.ID); after <= before {
		t.Errorf("B's policy-denied egress counter %d -> %d, want it to grow", before, after)
	}
	// The client, whom B's ingress policy allows, sends again: conntrack
	// holds the connection anew and the server's data gets through.
	start := time.Now()
	if err := exchange(cl, srv, "again", 5*time.Second); err != nil {
		t.Fatalf("A -> B after eviction: %v", err)
	}
	_ = cl.SetReadDeadline(time.Now().Add(15 * time.Second))
	got := make([]byte, len("push"))
	if _, err := io.ReadFull(cl, got); err != nil || string(got) != "push" {
		t.Fatalf("B's data after A sent again: %q, %v; want the retransmitted \"push\"", got, err)
	}
	t.Logf("B's retransmitted data arrived %v after A sent again", time.Since(start))
}

// worldButC lets the world into app=b on TCP 8080 and denies app=c.
const worldButC = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: b-world-but-c
  namespace: default
spec:
  endpointSelector:
    matchLabels:
      app: b
  ingress:
  - fromEntities:
    - world
    toPorts:
    - ports:
      - port: "8080"
        protocol: TCP
  - fromEndpoints:
    - matchLabels:
        k8s:app: a
    toPorts:
    - ports:
      - port: "8080"
        protocol: TCP
  ingressDeny:
  - fromEndpoints:
    - matchLabels:
        k8s:app: c
`

// inIPCache reports whether the pinned ipcache holds ip exactly.
func inIPCache(t *testing.T, e *nodeharness.Node, ip netip.Addr) bool {
	t.Helper()
	held, err := e.Linux().DumpIPCache(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_, ok := held[netip.PrefixFrom(ip, ip.BitLen())]
	return ok
}

// ipcacheActor is the ipcache actor's row of GET /v1/actors.
func ipcacheActor(t *testing.T, c *client.Client) *models.Actor {
	t.Helper()
	rows, err := c.Actors(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.Kind == "ipcache" {
			return r
		}
	}
	t.Fatal("no ipcache actor in GET /v1/actors")
	return nil
}

// droppedAs is endpoint id's ingress drop counter of reason.
func droppedAs(t *testing.T, c *client.Client, id int64, reason string) uint64 {
	t.Helper()
	p, err := c.EndpointPolicy(context.Background(), fmt.Sprint(id))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range p.Drops {
		if d.Reason == reason && d.Direction == "ingress" {
			return d.Packets
		}
	}
	return 0
}

// TestIPCacheFull is issue #38's "kernel map full" for the ipcache, on a
// real agent with --ipcache-max 16: pods are added until the ipcache
// refuses one's entry. That pod (app=c) is no world to its peers: B's
// policy lets the world in but denies app=c, and C's connections are
// dropped as unknown-pod (bpf/endpoint.c, unknown_pod), never let in as
// world; the refusal shows in membrane_bpf_map_full_total{map="ipcache"}
// and the ipcache actor's reconciler error naming the full ipcache.
// Deleting other pods frees entries: C's is written by itself and the
// deny rule decides on C's identity.
func TestIPCacheFull(t *testing.T) {
	e := newEnv(t, "10.240.0.0/24")
	startAgent(e, func(c *agent.Config) { c.Linux.Maps.IPCacheMax = datapath.MinIPCacheMax })
	c := e.Client()
	a := addPolicyPod(t, e, c, "pod-a", "k8s:app=a")
	b := addPolicyPod(t, e, c, "pod-b", "k8s:app=b")
	b.listen(t, 8080)
	if _, err := c.PolicyImport(context.Background(), []byte(worldButC), client.ContentTypeYAML); err != nil {
		t.Fatal(err)
	}
	// (No pod is app=c yet: the deny rule selects no identity.)
	policyscenario.WaitRealized(t, c, b.ep.ID, "world and A into B", func(m *policy.MapState) bool {
		return m.Allows(identity.ReservedWorld, 8080, policy.ProtoTCP, policy.Ingress)
	})
	mustTalk(t, a, b, 8080)

	// Pods labelled app=c until the ipcache has no room for one.
	var fillers []*policyPod
	var cc *policyPod
	for i := 0; cc == nil; i++ {
		if i == 2*datapath.MinIPCacheMax {
			t.Fatalf("%d pods all found room in an ipcache of %d", i, datapath.MinIPCacheMax)
		}
		before := metricValue(t, e, "membrane_bpf_map_full_total", "map", "ipcache")
		p := addPolicyPod(t, e, c, fmt.Sprintf("pod-c%d", i), "k8s:app=c")
		testutil.EventuallyErr(t, "pod "+podName(p)+" in the ipcache or refused", func() error {
			switch {
			case inIPCache(t, e, p.ips[0]):
				fillers = append(fillers, p)
			case metricValue(t, e, "membrane_bpf_map_full_total", "map", "ipcache") > before:
				cc = p
			default:
				return fmt.Errorf("neither")
			}
			return nil
		})
	}
	t.Logf("ipcache full after %d pods; %s (%s) has no entry", len(fillers), podName(cc), cc.ips[0])
	if n := metricValue(t, e, "membrane_bpf_map_entries", "map", "ipcache"); n != datapath.MinIPCacheMax {
		t.Errorf(`membrane_bpf_map_entries{map="ipcache"} %v, want %d (full)`, n, datapath.MinIPCacheMax)
	}
	if r := ipcacheActor(t, c).Reconciler; r == nil || !strings.Contains(r.LastError, "ipcache full") {
		t.Errorf("ipcache actor's reconciler %+v, want its last error naming the full ipcache", r)
	}
	before := droppedAs(t, c, b.ep.ID, datapath.DropUnknownPod)
	mustNotTalk(t, cc, b, 8080)
	if after := droppedAs(t, c, b.ep.ID, datapath.DropUnknownPod); after <= before {
		t.Errorf("B's unknown-pod ingress drops %d -> %d, want them to grow", before, after)
	}
	mustTalk(t, a, b, 8080)

	// Load drops: other pods go, C's entry is written by itself.
	start := time.Now()
	for _, p := range fillers[:3] {
		if err := e.Del(p.Pod); err != nil {
			t.Fatal(err)
		}
	}
	testutil.EventuallyErr(t, "C's ipcache entry", func() error {
		if !inIPCache(t, e, cc.ips[0]) {
			return fmt.Errorf("%s not in the ipcache", cc.ips[0])
		}
		return nil
	})
	t.Logf("C's ipcache entry written %v after the first of 3 DELs began", time.Since(start))
	before = droppedAs(t, c, b.ep.ID, datapath.DropPolicyDeny)
	mustNotTalk(t, cc, b, 8080)
	if after := droppedAs(t, c, b.ep.ID, datapath.DropPolicyDeny); after <= before {
		t.Errorf("B's policy-deny-rule ingress drops %d -> %d after C's entry came, want them to grow", before, after)
	}
	mustTalk(t, a, b, 8080)
}
