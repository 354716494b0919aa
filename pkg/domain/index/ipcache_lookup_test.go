package index

import (
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

func ipcacheWith(tb testing.TB, entries map[string]identity.NumericIdentity) *Index {
	tb.Helper()
	ix, err := New()
	if err != nil {
		tb.Fatal(err)
	}
	txn := ix.WriteTxn()
	for p, id := range entries {
		if err := txn.Insert(TableIPCache, &IPCacheEntry{Prefix: netip.MustParsePrefix(p), Identity: id}); err != nil {
			tb.Fatal(err)
		}
	}
	txn.Commit()
	return ix
}

// TestIPCacheLookupLengthSet: with the lengths the table holds known,
// the longest prefix match is the same as without (every length looked
// up), and a length left out of the set is not looked up.
func TestIPCacheLookupLengthSet(t *testing.T) {
	ix := ipcacheWith(t, map[string]identity.NumericIdentity{
		"10.0.0.0/8": 100, "10.1.0.0/16": 101, "10.1.2.3/32": 102, "fd00::/64": 200, "fd00::7/128": 201,
	})
	cases := map[string]identity.NumericIdentity{
		"10.1.2.3": 102, "10.1.2.4": 101, "10.2.0.1": 100, "11.0.0.1": 0,
		"fd00::7": 201, "fd00::8": 200, "fd01::1": 0, "::ffff:10.1.2.3": 102,
	}
	check := func(what string) {
		for a, want := range cases {
			id, ok := ix.IPCacheLookup(netip.MustParseAddr(a))
			if id != want || ok != (want != 0) {
				t.Errorf("%s: %s -> %d, %v; want %d", what, a, id, ok, want)
			}
		}
	}
	check("all lengths")
	var l IPCacheLengths
	for _, b := range []int{8, 16, 32} {
		l.Set(0, b)
	}
	for _, b := range []int{64, 128} {
		l.Set(1, b)
	}
	ix.SetIPCacheLengths(&l)
	check("the lengths held")
	var only32 IPCacheLengths
	only32.Set(0, 32)
	ix.SetIPCacheLengths(&only32)
	if id, ok := ix.IPCacheLookup(netip.MustParseAddr("10.1.2.4")); ok {
		t.Fatalf("a /16 matched with only /32 in the set: %d", id)
	}
}

// BenchmarkIPCacheLookupWorld: an address no prefix holds (the DNS
// proxy's lookup of a server outside the cluster), 200 /32 entries.
func BenchmarkIPCacheLookupWorld(b *testing.B) {
	entries := map[string]identity.NumericIdentity{}
	for i := range 200 {
		entries[netip.AddrFrom4([4]byte{10, 0, byte(i), 1}).String()+"/32"] = 1000
	}
	for _, known := range []bool{false, true} {
		name := "every-length"
		ix := ipcacheWith(b, entries)
		if known {
			name = "lengths-known"
			var l IPCacheLengths
			l.Set(0, 32)
			ix.SetIPCacheLengths(&l)
		}
		a := netip.MustParseAddr("192.0.2.53")
		b.Run(name, func(b *testing.B) {
			for range b.N {
				ix.IPCacheLookup(a)
			}
		})
	}
}
