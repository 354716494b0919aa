package agent_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// TestIPCachePrunedAtStart: an ipcache entry the datapath holds for an
// endpoint deleted while no agent ran is gone after the next start,
// while the restored endpoint's addresses and the gateways stay.
func TestIPCachePrunedAtStart(t *testing.T) {
	env := newRestoreEnv(t)
	fake := datapath.NewFake(1)
	a, c := env.start(t, fake)
	addPod(t, c, "p0", "web", true)
	p0 := waitReady(t, c, "container-id:p0")
	stop(t, a)
	stale := netip.MustParsePrefix("10.233.0.200/32")
	if err := fake.UpsertIPCache(context.Background(), stale, 999, netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	_, _ = env.start(t, fake)
	want := map[netip.Prefix]identity.NumericIdentity{
		netip.MustParsePrefix(p0.Addressing.IPv4 + "/32"):  identity.NumericIdentity(p0.Identity.ID),
		netip.MustParsePrefix(p0.Addressing.IPv6 + "/128"): identity.NumericIdentity(p0.Identity.ID),
		netip.MustParsePrefix("10.233.0.1/32"):             identity.ReservedHost,
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := fake.IPCache()
		_, staleLeft := got[stale]
		ok := !staleLeft
		for p, id := range want {
			ok = ok && got[p] == id
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ipcache after restart = %v; want %v and no %s", got, want, stale)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
