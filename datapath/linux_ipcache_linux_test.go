package datapath

import (
	"context"
	"maps"
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// dumpIPCache reads the pinned ipcache map back as prefixes.
func dumpIPCache(t *testing.T, l *Linux) map[netip.Prefix]identity.NumericIdentity {
	t.Helper()
	out, err := l.DumpIPCache(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestLinuxSyncIPCache: a sync deletes what is not desired (IPv4, IPv6,
// CIDRs), rewrites what differs, adds what is missing, leaves the rest,
// and a second sync changes nothing.
func TestLinuxSyncIPCache(t *testing.T) {
	l, _, _ := newTestLinux(t, LinuxConfig{})
	ctx := context.Background()
	pfx := netip.MustParsePrefix
	held := map[netip.Prefix]identity.NumericIdentity{
		pfx("10.244.9.2/32"):       300, // stale endpoint
		pfx("fd00:9::2/128"):       300, // stale endpoint, IPv6
		pfx("198.51.100.0/24"):     1 << 24,
		pfx("10.244.9.3/32"):       301, // kept
		pfx("10.244.9.4/32"):       302, // identity changed
		pfx("fd00:9::4/128"):       302, // kept, IPv6
		pfx("203.0.113.0/24"):      1<<24 + 1,
		pfx("::ffff:10.9.9.9/128"): 303, // stored as 10.9.9.9/32
	}
	for p, id := range held {
		var tun netip.Addr
		if p == pfx("10.244.9.3/32") {
			tun = netip.MustParseAddr("192.0.2.7") // a remote endpoint: its node
		}
		if err := l.UpsertIPCache(ctx, p, id, tun); err != nil {
			t.Fatal(err)
		}
	}
	base := dumpIPCache(t, l)
	node, node6 := netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("2001:db8::7")
	desired := map[netip.Prefix]IPCacheValue{
		pfx("10.244.9.3/32"):  {Identity: 301, TunnelEndpoint: node},
		pfx("10.244.9.4/32"):  {Identity: 402},
		pfx("fd00:9::4/128"):  {Identity: 302, TunnelEndpoint: node6}, // tunnel endpoint added
		pfx("203.0.113.0/24"): {Identity: 1<<24 + 1},
		pfx("10.9.9.9/32"):    {Identity: 303},
		pfx("10.244.9.5/32"):  {Identity: 403}, // new
	}
	st, err := l.SyncIPCache(ctx, desired)
	if err != nil {
		t.Fatal(err)
	}
	if want := (IPCacheSyncStats{Deleted: len(base) - 5, Written: 3}); st != want {
		t.Errorf("first sync = %+v, want %+v", st, want)
	}
	if got, err := l.DumpIPCacheValues(ctx); err != nil || !maps.Equal(got, desired) {
		t.Errorf("ipcache after sync = %v, want %v", got, desired)
	}
	st, err = l.SyncIPCache(ctx, desired)
	if err != nil || st != (IPCacheSyncStats{}) {
		t.Errorf("second sync = %+v, %v; want no change", st, err)
	}
	if _, err := l.SyncIPCache(ctx, map[netip.Prefix]IPCacheValue{{}: {Identity: 2}}); err == nil {
		t.Error("sync with an invalid prefix succeeded")
	}
}
