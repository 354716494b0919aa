package xdsapi

import (
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// TestIPCacheShards: every prefix lands in one shard, the same each time,
// the shards are used evenly enough, and Check refuses a shard out of
// range or holding another shard's prefix.
func TestIPCacheShards(t *testing.T) {
	entries := map[netip.Prefix]identity.NumericIdentity{}
	for i := range 4096 {
		entries[netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 32)] = 1000
	}
	entries[netip.MustParsePrefix("fd00::/64")] = 2000
	entries[netip.MustParsePrefix("0.0.0.0/0")] = 2
	shards := SplitIPCache(entries)
	n := 0
	for k, c := range shards {
		if c.Shard != k {
			t.Fatalf("shard %d says %d", k, c.Shard)
		}
		if err := c.Check(); err != nil {
			t.Fatal(err)
		}
		if len(c.Entries) < len(entries)/IPCacheShards/2 {
			t.Errorf("shard %d holds %d of %d prefixes", k, len(c.Entries), len(entries))
		}
		n += len(c.Entries)
	}
	if n != len(entries) {
		t.Fatalf("the shards hold %d prefixes, want %d", n, len(entries))
	}
	p := netip.MustParsePrefix("10.1.0.7/32")
	k := IPCacheShardOf(p)
	if IPCacheShardOf(p) != k || shards[k].Entries[p] != 1000 {
		t.Fatalf("%s not in its shard %d", p, k)
	}
	wrong := IPCache{Shard: (k + 1) % IPCacheShards, Entries: map[netip.Prefix]identity.NumericIdentity{p: 1}}
	if wrong.Check() == nil {
		t.Fatal("a shard holding another shard's prefix passed the check")
	}
	if (&IPCache{Shard: IPCacheShards}).Check() == nil {
		t.Fatal("a shard out of range passed the check")
	}
}
