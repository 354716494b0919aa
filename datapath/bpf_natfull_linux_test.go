package datapath

import (
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/service"
)

// TestNodePortNATExhausted is issue #38's "NAT ports exhausted" on real
// veths: node A's NodePort with its backend on node B SNATs each
// connection to a port of bpf/nodeport.h's range. With every port held
// by live connections of other clients (the fault, written into
// lb_nat_rev), a client's new connection gets no answer and is dropped as
// nat-exhausted: counted (endpoint 0, ingress) and notified (OnDrop,
// which the agent turns into membrane_drops_total and a datapath-drop
// event), never silently. When those connections end (their entries
// gone), the client's next connection is translated again.
func TestNodePortNATExhausted(t *testing.T) {
	nodeA, client, ad := nodePortRemote(t, false)
	var mu sync.Mutex
	var drops []DropEvent
	nodeA.SetHooks(LinuxHooks{OnDrop: func(d DropEvent) {
		mu.Lock()
		drops = append(drops, d)
		mu.Unlock()
	}})
	fe := netip.MustParseAddrPort(ad.nodeA + ":30080")
	be := netip.MustParseAddrPort(ad.pod + ":8080")
	dial := func(timeout time.Duration) error {
		return client.Do(func() error {
			c, err := net.DialTimeout("tcp", fe.String(), timeout)
			if err == nil {
				c.Close()
			}
			return err
		})
	}
	if err := dial(5 * time.Second); err != nil {
		t.Fatalf("TCP to %s before the fault: %v", fe, err)
	}
	b := nodeA.bpf
	key := func(port int) bpf.EndpointLbTuple {
		return bpf.EndpointLbTuple{Saddr: addrWords(addr16(be.Addr())), Daddr: addrWords(addr16(fe.Addr())),
			Sport: htons(be.Port()), Dport: htons(uint16(port)), Proto: service.TCP, Family: familyV4}
	}
	live := func(port int) bpf.EndpointLbNatrevValue {
		return bpf.EndpointLbNatrevValue{LastSeen: ktimeNow(), Client: addrWords(addr16(netip.MustParseAddr("192.168.93.99"))),
			Frontend: addrWords(addr16(fe.Addr())), ClientPort: htons(uint16(port)), FrontendPort: htons(fe.Port())}
	}
	// Every port held by a live connection of another client (the
	// first connection's included: it closed, its port would be free
	// after the FIN timeout).
	for p := natPortMin; p < natPortMin+natPortCount; p++ {
		if err := b.maps.lb.natRev.Update(key(p), live(p), ebpf.UpdateAny); err != nil {
			t.Fatalf("hold NAT port %d: %v", p, err)
		}
	}
	exhausted := func() uint64 {
		var v bpf.EndpointDropValue
		if err := b.maps.drops.Lookup(bpf.EndpointDropKey{Ep: 0, Reason: 17, Dir: 0}, &v); err != nil {
			return 0
		}
		return v.Packets
	}
	before := exhausted()
	if err := dial(1500 * time.Millisecond); err == nil {
		t.Fatal("a new connection was translated with every NAT port held")
	}
	if after := exhausted(); after <= before {
		t.Errorf("nat-exhausted drops %d -> %d, want them to grow", before, after)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := 0
		for _, d := range drops {
			if d.Reason == DropNATExhausted && d.Endpoint == 0 && d.Dst == fe.Addr() && d.DstPort == fe.Port() {
				n++
			}
		}
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no nat-exhausted drop notification for the refused connection")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The other clients' connections end: their entries go.
	for p := natPortMin; p < natPortMin+natPortCount; p++ {
		if err := b.maps.lb.natRev.Delete(key(p)); err != nil {
			t.Fatalf("release NAT port %d: %v", p, err)
		}
	}
	start := time.Now()
	if err := dial(5 * time.Second); err != nil {
		t.Fatalf("TCP to %s after the NAT ports were released: %v", fe, err)
	}
	t.Logf("connected %v after the NAT ports were released", time.Since(start))
	if _, reply := dialWho(t, client, "tcp", fe.String()); reply == "" {
		t.Fatal("no reply from the backend after the NAT ports were released")
	}
}
