package datapath

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/domain/service"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// flowLog collects flow reports.
type flowLog struct {
	mu    sync.Mutex
	flows []FlowEvent
}

func (f *flowLog) add(ev FlowEvent) {
	f.mu.Lock()
	f.flows = append(f.flows, ev)
	f.mu.Unlock()
}

// match returns the flows for which keep is true.
func (f *flowLog) match(keep func(FlowEvent) bool) []FlowEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []FlowEvent
	for _, ev := range f.flows {
		if keep(ev) {
			out = append(out, ev)
		}
	}
	return out
}

// newFlowsE2E is the end-to-end environment (pods a, b, c) with flow
// reports on, collected in the returned log.
func newFlowsE2E(t *testing.T) (*e2eEnv, *flowLog) {
	t.Helper()
	e := newE2E(t, LinuxConfig{Flows: true})
	fl := &flowLog{}
	e.l.SetHooks(LinuxHooks{OnDrop: e.drops.add, OnFlow: fl.add})
	return e, fl
}

// to selects the flows an endpoint saw in dir towards dst:port.
func to(p *testPod, dir policy.Direction, dst netip.Addr, port uint16) func(FlowEvent) bool {
	return func(ev FlowEvent) bool {
		return ev.Endpoint == p.ep.ID && ev.Dir == dir && ev.Dst == dst && ev.DstPort == port
	}
}

// sentinel makes a new connection from b to a:8080 and waits for both
// its flows (B's egress, A's ingress): the ring delivers in order, so
// every flow reported before them has been read.
func sentinel(e *e2eEnv, fl *flowLog) {
	e.t.Helper()
	before := len(fl.match(to(e.a, policy.Ingress, e.a.addr(), 8080)))
	e.mustTalk(e.b, e.a, 8080)
	testutil.Eventually(e.t, "the sentinel connection's flows", func() bool {
		return len(fl.match(to(e.a, policy.Ingress, e.a.addr(), 8080))) > before &&
			len(fl.match(to(e.b, policy.Egress, e.a.addr(), 8080))) > before
	})
}

// TestFlowsOnePerConnection: a forwarded TCP connection is reported once
// by each endpoint that sees it (A's egress, B's ingress), for its first
// packet (a SYN), with both identities; its other packets (data, FIN,
// the replies) report nothing.
func TestFlowsOnePerConnection(t *testing.T) {
	e, fl := newFlowsE2E(t)
	a, b := e.a, e.b
	e.mustTalk(a, b, 8080)
	sentinel(e, fl)
	for _, c := range []struct {
		p    *testPod
		dir  policy.Direction
		peer *testPod
	}{{a, policy.Egress, b}, {b, policy.Ingress, a}} {
		got := fl.match(to(c.p, c.dir, b.addr(), 8080))
		if len(got) != 1 {
			t.Fatalf("endpoint %d %s: %d flows for one connection, want 1: %+v", c.p.ep.ID, c.dir, len(got), got)
		}
		f := got[0]
		if f.Verdict != FlowForwarded || f.Src != a.addr() || f.Proto != policy.ProtoTCP || f.TCPFlags != 0x02 ||
			f.Identity != c.p.ep.Identity || f.PeerIdentity != c.peer.ep.Identity || f.Frontend.IsValid() || f.Enforced {
			t.Errorf("endpoint %d %s: flow %+v, want forwarded SYN from %s, identity %d, peer %d", c.p.ep.ID, c.dir, f, a.addr(),
				c.p.ep.Identity, c.peer.ep.Identity)
		}
	}
	st, err := e.l.FlowStats()
	if err != nil || st.Reported < 4 || st.FlowsLost != 0 {
		t.Errorf("FlowStats = %+v, %v; want at least 4 reported, none lost", st, err)
	}

	// Enforced: B admits A on 8080; the flow says an entry allowed it.
	b.ep.Policy = bOnly8080From(a.ep.Identity)
	e.realize(b)
	e.mustTalk(a, b, 8080)
	sentinel(e, fl)
	got := fl.match(to(b, policy.Ingress, b.addr(), 8080))
	if len(got) != 2 || !got[1].Enforced || got[1].PeerIdentity != a.ep.Identity {
		t.Fatalf("B's ingress flows after its policy: %+v, want a second one, enforced, peer %d", got, a.ep.Identity)
	}
}

// TestFlowsService: a connection to a Service frontend is reported with
// the backend as its destination and the frontend it was sent to.
func TestFlowsService(t *testing.T) {
	e, fl := newFlowsE2E(t)
	fe := service.Frontend{Addr: netip.MustParseAddr("10.96.60.10"), Port: 80, Proto: service.TCP}
	svc := LBService{ID: 7, Frontend: fe, Backends: []service.Backend{{Addr: e.b.addr(), Port: 8080}}}
	if err := e.l.UpsertService(context.Background(), svc, 0); err != nil {
		t.Fatal(err)
	}
	if err := testutil.Exchange(e.a.ns, fe.Addr, 80, connectTimeout); err != nil {
		t.Fatalf("a -> %s:80: %v", fe.Addr, err)
	}
	sentinel(e, fl)
	got := fl.match(to(e.a, policy.Egress, e.b.addr(), 8080))
	if len(got) != 1 {
		t.Fatalf("A's flows to the backend: %+v, want 1", got)
	}
	if want := netip.AddrPortFrom(fe.Addr, 80); got[0].Frontend != want || got[0].Verdict != FlowForwarded {
		t.Errorf("flow %+v, want frontend %s, forwarded", got[0], want)
	}
	// The sentinel went straight to A: no frontend.
	if s := fl.match(to(e.b, policy.Egress, e.a.addr(), 8080)); s[0].Frontend.IsValid() {
		t.Errorf("direct connection reported frontend %s", s[0].Frontend)
	}
}

// TestFlowsOff: with flow_config off, the programs report nothing and
// count nothing; turning it on again needs no reload.
func TestFlowsOff(t *testing.T) {
	e, fl := newFlowsE2E(t)
	if err := e.l.SetFlows(false); err != nil {
		t.Fatal(err)
	}
	before, err := e.l.FlowStats()
	if err != nil {
		t.Fatal(err)
	}
	e.mustTalk(e.a, e.b, 8080)
	e.mustTalk(e.c, e.b, 8081)
	after, err := e.l.FlowStats()
	if err != nil {
		t.Fatal(err)
	}
	if after.Reported != before.Reported {
		t.Fatalf("flows off: %d flows reported", after.Reported-before.Reported)
	}
	if err := e.l.SetFlows(true); err != nil {
		t.Fatal(err)
	}
	sentinel(e, fl)
	if got := fl.match(func(FlowEvent) bool { return true }); len(got) != 2 {
		t.Fatalf("flows: %+v, want only the sentinel's two", got)
	}
}

// TestFlowsRingFull: while the reader is stuck, new connections beyond
// the ring's room are lost and counted in the programs' counter.
func TestFlowsRingFull(t *testing.T) {
	e, fl := newFlowsE2E(t)
	release := make(chan struct{})
	var once sync.Once
	stuck := func(ev FlowEvent) { <-release; fl.add(ev) }
	e.l.SetHooks(LinuxHooks{OnFlow: stuck})
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	// 4000 UDP datagrams to distinct ports of B: 4000 connections
	// (8000 reports with B's ingress), more than the 256 KiB ring holds.
	const n = 4000
	err := e.a.ns.Do(func() error {
		c, err := net.ListenUDP("udp4", nil)
		if err != nil {
			return err
		}
		defer c.Close()
		for i := range n {
			dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(e.b.addr(), uint16(20000+i)))
			if _, err := c.WriteToUDP([]byte("x"), dst); err != nil {
				return fmt.Errorf("datagram %d: %w", i, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := e.l.FlowStats()
	if err != nil {
		t.Fatal(err)
	}
	if st.FlowsLost == 0 || st.Reported+st.FlowsLost < 2*n {
		t.Fatalf("FlowStats = %+v after %d new connections with the reader stuck, want losses counted", st, 2*n)
	}
	once.Do(func() { close(release) })
}

// TestFlowsVerdictChange: a connection established while allowed is
// reported once; when a policy change denies it, its next packet is
// reported as a drop (the programs re-check policy on every packet of the
// original direction), tuple and all.
func TestFlowsVerdictChange(t *testing.T) {
	e, fl := newFlowsE2E(t)
	a, b := e.a, e.b
	var conn net.Conn
	err := a.ns.Do(func() (err error) {
		conn, err = net.DialTimeout("tcp", netip.AddrPortFrom(b.addr(), 8080).String(), connectTimeout)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	local := conn.LocalAddr().(*net.TCPAddr).AddrPort()
	testutil.Eventually(t, "the connection's flow at B", func() bool {
		return len(fl.match(func(ev FlowEvent) bool { return ev.Endpoint == b.ep.ID && ev.SrcPort == local.Port() })) == 1
	})
	// B now admits only C: A's established connection is denied.
	b.ep.Policy = bOnly8080From(e.c.ep.Identity)
	e.realize(b)
	_ = conn.SetWriteDeadline(time.Now().Add(connectTimeout))
	if _, err := conn.Write([]byte("after the change\n")); err != nil {
		t.Fatal(err)
	}
	e.waitDrop(DropEvent{Endpoint: b.ep.ID, Reason: DropPolicy, Dir: policy.Ingress, Src: a.addr(), Dst: b.addr(),
		DstPort: 8080, Proto: policy.ProtoTCP, TCPFlags: 0x18, PeerIdentity: a.ep.Identity}) // PSH|ACK: data
	if got := fl.match(func(ev FlowEvent) bool { return ev.SrcPort == local.Port() }); len(got) != 2 {
		t.Errorf("flows of the connection: %+v, want A's and B's first packet only", got)
	}
}
