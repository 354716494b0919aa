package datapath

import (
	"net/netip"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// ctPressure is the conntrack scenario of TestCTGCKeepsRepliesUnderPressure.
const (
	ctLive     = 2000  // allowed connections, idle since they were made
	ctDead     = 63000 // entries the programs already treat as gone
	ctNewFlows = 8000  // new connections made afterwards
)

// ctPressure fills the ct map (65,536 entries) with ctLive connections
// the endpoint made (egress open, ingress default-deny: their replies pass
// only through conntrack) and ctDead expired entries, optionally runs
// conntrack passes over the whole map, then makes ctNewFlows new
// connections and returns how many of the live connections' replies the
// program drops, and how long the passes took.
func ctPressure(t *testing.T, gc bool) (dropped int, gcTime time.Duration, deleted int) {
	h := newPolicyHarness(t)
	h.setPolicy(t, policy.NewMapState(1, true, false, nil))
	live := make([]pkt, ctLive)
	for i := range live {
		live[i] = conn(policy.Egress, peerA, policy.ProtoTCP, 443)
		live[i].sport = uint16(10000 + i)
		if got := h.run(t, policy.Egress, live[i]); got != verdictPass {
			t.Fatalf("live connection %d: egress = %d", i, got)
		}
	}
	now := ktimeNow()
	keys := make([]bpf.EndpointCtKey, ctDead)
	vals := make([]bpf.EndpointCtValue, ctDead)
	for i := range keys {
		keys[i] = bpf.EndpointCtKey{Ep: uint16(100 + i%300), Dir: 1, Family: familyV4, Proto: policy.ProtoUDP,
			Sport: uint16(i), Dport: 53}
		keys[i].Saddr[0], keys[i].Daddr[0] = uint32(i), 0x08080808
		vals[i] = bpf.EndpointCtValue{LastSeen: now - uint64(2*ctLifetimeOther), Packets: 1}
	}
	if _, err := h.b.maps.ct.BatchUpdate(keys, vals, nil); err != nil {
		t.Fatalf("insert expired entries: %v", err)
	}
	if gc {
		var g ctCollector
		start := time.Now()
		for done := false; !done; {
			_, n, d, err := g.pass(h.b.maps.ct, ktimeNow(), DefaultCTGCBudget)
			if err != nil {
				t.Fatal(err)
			}
			deleted, done = deleted+n, d
		}
		gcTime = time.Since(start)
	}
	for i := range ctNewFlows {
		p := conn(policy.Egress, netip.AddrFrom4([4]byte{10, 9, byte(i >> 8), byte(i)}), policy.ProtoUDP, 53)
		if got := h.run(t, policy.Egress, p); got != verdictPass {
			t.Fatalf("new flow %d: egress = %d", i, got)
		}
	}
	for _, p := range live {
		if h.run(t, policy.Ingress, p.reply()) != verdictPass {
			dropped++
		}
	}
	return dropped, gcTime, deleted
}

// TestCTGCKeepsRepliesUnderPressure: with the conntrack map full of dead
// entries, new connections make the LRU map evict; after a collector
// cycle (which deletes exactly the dead entries) no allowed reply is
// dropped. Without the cycle the same scenario is logged for comparison
// (BENCHMARKS.md): the LRU evicts the idle live connections first.
func TestCTGCKeepsRepliesUnderPressure(t *testing.T) {
	without, _, _ := ctPressure(t, false)
	with, took, deleted := ctPressure(t, true)
	t.Logf("replies of %d idle allowed connections dropped after %d new flows: %d without conntrack GC, %d with (%d dead entries deleted in %v)",
		ctLive, ctNewFlows, without, with, deleted, took)
	if deleted != ctDead {
		t.Errorf("collector deleted %d entries, want the %d expired ones", deleted, ctDead)
	}
	if with != 0 {
		t.Fatalf("%d of %d allowed replies dropped under table pressure after conntrack GC", with, ctLive)
	}
}

// TestCTGCPassBounded: a pass examines at most its budget, resumes where
// the previous one stopped, and a whole cycle deletes every expired entry
// and nothing else (live TCP and UDP entries, an entry from the future).
func TestCTGCPassBounded(t *testing.T) {
	h := newProgHarness(t, 7, 5000)
	m := h.b.maps.ct
	now := ktimeNow()
	put := func(i int, proto uint8, lastSeen uint64) {
		k := bpf.EndpointCtKey{Ep: 7, Dir: 1, Family: familyV4, Proto: proto, Sport: uint16(i), Dport: 80}
		k.Saddr[0] = uint32(i)
		if err := m.Update(k, bpf.EndpointCtValue{LastSeen: lastSeen}, 0); err != nil {
			t.Fatal(err)
		}
	}
	const n = 3000
	for i := range n {
		switch i % 4 {
		case 0: // expired UDP
			put(i, policy.ProtoUDP, now-uint64(2*ctLifetimeOther))
		case 1: // live UDP
			put(i, policy.ProtoUDP, now-uint64(ctLifetimeOther/2))
		case 2: // idle TCP, still within its lifetime
			put(i, policy.ProtoTCP, now-uint64(2*ctLifetimeOther))
		case 3: // refreshed after now
			put(i, policy.ProtoUDP, now+uint64(time.Second))
		}
	}
	var g ctCollector
	total, passes := 0, 0
	for done := false; !done; passes++ {
		examined, deleted, d, err := g.pass(m, now, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if examined > 1000+ctMinBatch {
			t.Fatalf("pass %d examined %d entries, budget 1000", passes, examined)
		}
		total, done = total+deleted, d
	}
	if passes < 3 {
		t.Errorf("a cycle over %d entries took %d passes of budget 1000", n, passes)
	}
	if total != n/4 {
		t.Errorf("cycle deleted %d, want %d", total, n/4)
	}
	if got := ctCount(t, &Linux{bpf: h.b})[7]; got != n-n/4 {
		t.Errorf("%d entries left, want %d", got, n-n/4)
	}
}

// TestCTGCLoop: the Linux datapath's collector runs on its own and
// deletes expired entries.
func TestCTGCLoop(t *testing.T) {
	l, _, _ := newTestLinux(t, LinuxConfig{TeardownDelay: -1,
		CTGC: CTGCConfig{Interval: 10 * time.Millisecond, MinInterval: 10 * time.Millisecond, MaxInterval: 20 * time.Millisecond}})
	k := bpf.EndpointCtKey{Ep: 9, Dir: 1, Family: familyV4, Proto: policy.ProtoUDP, Sport: 1, Dport: 2}
	if err := l.bpf.maps.ct.Update(k, bpf.EndpointCtValue{LastSeen: ktimeNow() - uint64(2*ctLifetimeOther)}, 0); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for ctCount(t, l)[9] != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("expired entry not collected; stats %+v", l.CTGCStats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st := l.CTGCStats(); st.Passes == 0 || st.Deleted == 0 {
		t.Fatalf("stats %+v after a collection", st)
	}
}
