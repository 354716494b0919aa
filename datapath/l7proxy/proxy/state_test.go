package proxy

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"testing"

	"github.com/membrane-cni/membrane/datapath/l7proxy/xdsapi"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

func encodeResources(t *testing.T, shards []xdsapi.IPCache) [][]byte {
	t.Helper()
	var out [][]byte
	for i := range shards {
		b, err := json.Marshal(&xdsapi.Resource{IPCache: &shards[i]})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// TestBuildStateShards: a version's ipcache is the union of its shards
// (found by longest prefix), a shard sent unchanged is not decoded again
// (the next version shares its map), and a version with a shard twice or
// a prefix in the wrong shard is refused.
func TestBuildStateShards(t *testing.T) {
	entries := map[netip.Prefix]identity.NumericIdentity{}
	for i := range 300 {
		entries[netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 2, byte(i >> 8), byte(i)}), 32)] = identity.NumericIdentity(1000 + i)
	}
	entries[netip.MustParsePrefix("10.3.0.0/16")] = 77
	shards := xdsapi.SplitIPCache(entries)
	raw := encodeResources(t, shards[:])
	st, dec, err := buildState("v1", raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	if id := st.identityOf(netip.MustParseAddr("10.2.0.5")); id != 1005 {
		t.Fatalf("10.2.0.5 -> %d, want 1005", id)
	}
	if id := st.identityOf(netip.MustParseAddr("10.3.9.9")); id != 77 {
		t.Fatalf("10.3.9.9 -> %d, want 77 (the /16)", id)
	}
	if id := st.identityOf(netip.MustParseAddr("192.0.2.1")); id != identity.ReservedWorld {
		t.Fatalf("an address outside every prefix -> %d", id)
	}
	// One shard changes: the others are not decoded again.
	p := netip.MustParsePrefix("10.2.0.5/32")
	k := xdsapi.IPCacheShardOf(p)
	changed := shards
	changed[k] = xdsapi.IPCache{Shard: k, Entries: map[netip.Prefix]identity.NumericIdentity{p: 4242}}
	st2, _, err := buildState("v2", encodeResources(t, changed[:]), dec)
	if err != nil {
		t.Fatal(err)
	}
	if id := st2.identityOf(p.Addr()); id != 4242 {
		t.Fatalf("after the change %s -> %d, want 4242", p, id)
	}
	for j := range shards {
		same := reflect.ValueOf(st2.ipcache[j]).UnsafePointer() == reflect.ValueOf(st.ipcache[j]).UnsafePointer()
		if same != (j != k) {
			t.Fatalf("shard %d (changed: %d) shared with the previous version: %v", j, k, same)
		}
	}
	// Refused: a shard twice, a prefix in the wrong shard.
	if _, _, err := buildState("v3", append(raw, raw[0]), dec); err == nil {
		t.Fatal("a version with a shard twice was applied")
	}
	wrong := []xdsapi.IPCache{{Shard: (k + 1) % xdsapi.IPCacheShards, Entries: map[netip.Prefix]identity.NumericIdentity{p: 1}}}
	if _, _, err := buildState("v4", encodeResources(t, wrong), nil); err == nil {
		t.Fatal("a shard holding another shard's prefix was applied")
	}
}
