package fqdn

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"
)

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

func TestCacheLearnExpire(t *testing.T) {
	c := NewCache(CacheConfig{MinTTL: 5 * time.Second})
	t0 := time.Unix(1000, 0)
	changed, err := c.Learn(1, "Allowed.Test", addrs("10.0.0.1", "10.0.0.2"), 2*time.Second, t0)
	if err != nil || !changed {
		t.Fatalf("learn: changed %v err %v", changed, err)
	}
	// A second endpoint learning the same address changes nothing.
	if changed, _ := c.Learn(2, "allowed.test.", addrs("10.0.0.1"), 20*time.Second, t0); changed {
		t.Fatal("same address from another endpoint reported a change")
	}
	if got := c.IPs("allowed.test"); !slices.Equal(got, addrs("10.0.0.1", "10.0.0.2")) {
		t.Fatalf("IPs = %v", got)
	}
	if next, ok := c.Next(); !ok || !next.Equal(t0.Add(5*time.Second)) {
		t.Fatalf("Next = %v %v, want the min TTL", next, ok)
	}
	if got := c.Expire(t0.Add(4 * time.Second)); len(got) != 0 {
		t.Fatalf("expired early: %v", got)
	}
	// Endpoint 1's entries expire; 10.0.0.1 is still endpoint 2's.
	if got := c.Expire(t0.Add(5 * time.Second)); !slices.Equal(got, []string{"allowed.test."}) {
		t.Fatalf("Expire = %v", got)
	}
	if got := c.IPs("allowed.test"); !slices.Equal(got, addrs("10.0.0.1")) {
		t.Fatalf("IPs after expiry = %v", got)
	}
	if got := c.Forget(2); !slices.Equal(got, []string{"allowed.test."}) || c.Len() != 0 || len(c.Names()) != 0 {
		t.Fatalf("Forget = %v, len %d", got, c.Len())
	}
	if _, ok := c.Next(); !ok {
		t.Fatal("Next is cleared only by Expire")
	}
	c.Expire(t0.Add(time.Minute))
	if _, ok := c.Next(); ok {
		t.Fatal("Next after everything expired")
	}
}

func TestCacheLimitAndRefresh(t *testing.T) {
	c := NewCache(CacheConfig{MaxIPsPerEndpoint: 2})
	t0 := time.Unix(1000, 0)
	if _, err := c.Learn(1, "a.test", addrs("10.0.0.1", "10.0.0.2", "10.0.0.3"), time.Minute, t0); !errors.Is(err, ErrLimit) {
		t.Fatalf("over the limit: %v", err)
	}
	if c.Len() != 0 {
		t.Fatal("a refused learn recorded entries")
	}
	if _, err := c.Learn(1, "a.test", addrs("10.0.0.1"), time.Second, t0); err != nil {
		t.Fatal(err)
	}
	// Re-learning refreshes the expiry and counts once.
	if _, err := c.Learn(1, "a.test", addrs("10.0.0.1"), time.Minute, t0); err != nil || c.Len() != 1 {
		t.Fatalf("refresh: %v len %d", err, c.Len())
	}
	if got := c.Expire(t0.Add(30 * time.Second)); len(got) != 0 {
		t.Fatalf("refreshed entry expired: %v", got)
	}
	es := c.Entries(nil)
	if len(es) != 1 || es[0].Name != "a.test." || !es[0].Expires.Equal(t0.Add(time.Minute)) {
		t.Fatalf("Entries = %+v", es)
	}
	if got := c.Lifetime(0); got != MinLifetime {
		t.Fatalf("Lifetime(0) = %v", got)
	}
}
