package fqdn

import (
	"net/netip"
	"slices"
	"testing"
	"time"
)

// TestFileRoundTrip: entries written and read back keep their expiries;
// the ones expired at the read are left out; another version and junk
// are refused.
func TestFileRoundTrip(t *testing.T) {
	now := time.Unix(1700000000, 0).UTC()
	es := []Entry{
		{Endpoint: 1, Name: "a.test.", IP: netip.MustParseAddr("192.0.2.1"), Expires: now.Add(time.Minute)},
		{Endpoint: 1, Name: "b.test.", IP: netip.MustParseAddr("2001:db8::1"), Expires: now.Add(-time.Second)},
		{Endpoint: 2, Name: "a.test.", IP: netip.MustParseAddr("192.0.2.1"), Expires: now},
	}
	b, err := MarshalFile(es)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseFile(b, now)
	if err != nil || !slices.Equal(got, es[:1]) {
		t.Fatalf("ParseFile = %+v, %v; want only the entry alive after now: %+v", got, err, es[:1])
	}
	for _, bad := range []string{`{"version":2,"entries":[]}`, `{`, `[]`} {
		if _, err := ParseFile([]byte(bad), now); err == nil {
			t.Errorf("ParseFile(%s) accepted", bad)
		}
	}
}

// TestCacheRestore: restored entries keep their expiry (and expire at
// it), expired ones are skipped, the per-endpoint bound holds, and the
// names whose addresses changed are reported.
func TestCacheRestore(t *testing.T) {
	now := time.Unix(1700000000, 0)
	c := NewCache(CacheConfig{MaxIPsPerEndpoint: 2})
	ip := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	changed := c.Restore([]Entry{
		{Endpoint: 1, Name: "A.test", IP: ip("192.0.2.1"), Expires: now.Add(time.Minute)},
		{Endpoint: 2, Name: "a.test.", IP: ip("192.0.2.1"), Expires: now.Add(2 * time.Minute)},
		{Endpoint: 1, Name: "old.test.", IP: ip("192.0.2.9"), Expires: now},
		{Endpoint: 1, Name: "b.test.", IP: ip("192.0.2.2"), Expires: now.Add(time.Minute)},
		{Endpoint: 1, Name: "c.test.", IP: ip("192.0.2.3"), Expires: now.Add(time.Minute)}, // over the bound
	}, now)
	if !slices.Equal(changed, []string{"a.test.", "b.test."}) {
		t.Errorf("Restore changed %v, want [a.test. b.test.]", changed)
	}
	if c.Len() != 3 || len(c.IPs("old.test.")) != 0 || len(c.IPs("c.test.")) != 0 {
		t.Errorf("after Restore: %d entries, %+v", c.Len(), c.Entries(nil))
	}
	if next, ok := c.Next(); !ok || !next.Equal(now.Add(time.Minute)) {
		t.Errorf("Next = %v %v, want the earliest restored expiry", next, ok)
	}
	if got := c.Expire(now.Add(time.Minute)); !slices.Equal(got, []string{"b.test."}) {
		t.Errorf("Expire at the first expiry = %v, want [b.test.] (a.test. still held by endpoint 2)", got)
	}
	if got := c.IPs("a.test"); !slices.Equal(got, []netip.Addr{ip("192.0.2.1")}) {
		t.Errorf("IPs(a.test) = %v", got)
	}
}
