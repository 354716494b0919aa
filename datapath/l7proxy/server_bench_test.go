package l7proxy

import (
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/membrane-cni/membrane/datapath/l7proxy/xdsapi"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// BenchmarkSetIPCache: one publication of an ipcache mirror of 5,000
// entries (what every remote endpoint change cost with L7 on before the
// Linux datapath published once per batch).
func BenchmarkSetIPCache(b *testing.B) {
	srv, err := NewServer(filepath.Join(b.TempDir(), "xds.sock"), NewTracker(nil, nil), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Close)
	entries := map[netip.Prefix]identity.NumericIdentity{}
	for i := range 5000 {
		entries[netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 246, byte(i >> 8), byte(i)}), 32)] = identity.NumericIdentity(1000 + i%300)
	}
	for b.Loop() {
		if _, err := srv.SetIPCache(IPCache{Entries: entries}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSetIPCacheShard: the same mirror, one changed shard published
// (what a batch touching one prefix costs now).
func BenchmarkSetIPCacheShard(b *testing.B) {
	srv, err := NewServer(filepath.Join(b.TempDir(), "xds.sock"), NewTracker(nil, nil), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Close)
	entries := map[netip.Prefix]identity.NumericIdentity{}
	for i := range 5000 {
		entries[netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 246, byte(i >> 8), byte(i)}), 32)] = identity.NumericIdentity(1000 + i%300)
	}
	shards := xdsapi.SplitIPCache(entries)
	for b.Loop() {
		if _, err := srv.SetIPCacheShards(shards[3]); err != nil {
			b.Fatal(err)
		}
	}
}
