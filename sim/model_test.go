package sim

import (
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestPodNames(t *testing.T) {
	tests := []struct {
		slot int32
		gen  uint32
		cid  string
	}{
		{0, 1, "sim-0-1"},
		{12, 7, "sim-12-7"},
		{50000, 4294967295, "sim-50000-4294967295"},
	}
	for _, tt := range tests {
		t.Run(tt.cid, func(t *testing.T) {
			k := makeKey(tt.slot, tt.gen)
			if got := k.containerID(); got != tt.cid {
				t.Fatalf("containerID = %q, want %q", got, tt.cid)
			}
			if got, ok := parseContainerID(tt.cid); !ok || got != k {
				t.Fatalf("parseContainerID(%q) = %v, %v", tt.cid, got, ok)
			}
			if got, ok := parseOwner(k.owner()); !ok || got != k {
				t.Fatalf("parseOwner(%q) = %v, %v", k.owner(), got, ok)
			}
		})
	}
	for _, bad := range []string{"", "sim-", "sim-1", "sim-x-1", "sim--1-2", "probe", "other-1-2"} {
		if _, ok := parseContainerID(bad); ok {
			t.Errorf("parseContainerID(%q) accepted", bad)
		}
	}
	if _, ok := parseOwner("default/web-0"); ok {
		t.Error("parseOwner accepted a pod the harness does not own")
	}
}

func TestModelLiveSet(t *testing.T) {
	m := newModel(4, netip.MustParsePrefix("10.0.0.0/24"), time.Now())
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 4; i++ {
		p := m.newPod()
		if p == nil {
			t.Fatalf("newPod %d = nil with free slots", i)
		}
		m.putLive(p)
	}
	if m.newPod() != nil {
		t.Fatal("newPod returned a pod with every slot taken")
	}
	seen := map[int32]bool{}
	for i := 0; i < 4; i++ {
		p := m.takeLive(rng, podDeleting)
		if p == nil || seen[p.slot] || p.pos != -1 {
			t.Fatalf("takeLive %d = %+v (seen %v)", i, p, seen)
		}
		if _, st := p.load(); st != podDeleting {
			t.Fatalf("taken pod in state %s", st)
		}
		seen[p.slot] = true
		m.freePod(p)
	}
	if m.takeLive(rng, podBusy) != nil || m.liveCount() != 0 {
		t.Fatal("live set not empty")
	}
	p := m.newPod()
	if p.gen != 2 {
		t.Fatalf("reused slot has generation %d, want 2", p.gen)
	}
	if st, cur := m.classify(makeKey(p.slot, 1)); cur || st != podAdding {
		t.Fatalf("classify(old generation) = %s, current %v", st, cur)
	}
}

func TestModelIPOwnership(t *testing.T) {
	m := newModel(2, netip.MustParsePrefix("10.0.0.0/24"), time.Now())
	a, b := m.newPod(), m.newPod()
	ip := addrToU32(netip.MustParseAddr("10.0.0.7"))
	a.ip = ip
	if prev := m.ownIP(a, ip); prev != 0 {
		t.Fatalf("first owner: prev = %d", prev)
	}
	if prev := m.ownIP(b, ip); prev != a.slot+1 {
		t.Fatalf("address given twice: prev = %d, want %d", prev, a.slot+1)
	}
	b.ip = ip
	m.disownIP(b)
	if prev := m.ownIP(a, ip); prev != 0 {
		t.Fatalf("after the release: prev = %d", prev)
	}
	if got := u32ToAddr(ip); got.String() != "10.0.0.7" {
		t.Fatalf("u32ToAddr = %s", got)
	}
}

func TestHistory(t *testing.T) {
	m := newModel(1, netip.MustParsePrefix("10.0.0.0/24"), time.Now())
	p := m.newPod()
	for i := 0; i < histLen+3; i++ {
		m.record(p, opRegenerate, resOK, "")
	}
	m.record(p, opDelete, resAPI, "500 internal")
	h := m.history(p)
	if len(h) != histLen+1 || !strings.HasPrefix(h[histHead], "...") {
		t.Fatalf("history = %q, want %d events and a marker after the first %d", h, histLen, histHead)
	}
	if last := h[len(h)-1]; last[len(last)-len("endpoint_delete: api-error 500 internal"):] != "endpoint_delete: api-error 500 internal" {
		t.Fatalf("last entry = %q", last)
	}
}
