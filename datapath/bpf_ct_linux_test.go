package datapath

import (
	"context"
	"strconv"
	"testing"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// ctCount counts the conntrack entries per endpoint.
func ctCount(t *testing.T, l *Linux) map[endpoint.ID]int {
	t.Helper()
	out := map[endpoint.ID]int{}
	var k bpf.EndpointCtKey
	var v bpf.EndpointCtValue
	it := l.bpf.maps.ct.Iterate()
	for it.Next(&k, &v) {
		out[endpoint.ID(k.Ep)]++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestBPFRemoveFlushesConntrack: removing an endpoint deletes its
// conntrack entries (more than one batch of them among other
// endpoints'), and only its, so a later endpoint with the same ID
// inherits none; removing it again is still success.
func TestBPFRemoveFlushesConntrack(t *testing.T) {
	l, _, nl := newTestLinux(t, LinuxConfig{TeardownDelay: -1})
	ctx := context.Background()
	ep := addVeth(t, nl, 31, "lxcbpfct1", "10.244.71.3")
	if _, err := l.Realize(ctx, ep, 1); err != nil {
		t.Fatal(err)
	}
	want := map[endpoint.ID]int{31: ctBatch + 10, 32: ctBatch/2 + 3, 3100: 5}
	for id, n := range want {
		for i := 0; i < n; i++ {
			k := bpf.EndpointCtKey{Ep: uint16(id), Dir: 1, Family: familyV4, Proto: 6, Sport: uint16(i), Dport: 8080}
			k.Saddr[0], k.Daddr[0] = uint32(i), uint32(id)
			if err := l.bpf.maps.ct.Update(k, bpf.EndpointCtValue{LastSeen: 1, Packets: 1}, 0); err != nil {
				t.Fatalf("insert conntrack entry %d of endpoint %d: %v", i, id, err)
			}
		}
	}
	if got := ctCount(t, l); got[31] != want[31] || got[32] != want[32] {
		t.Fatalf("conntrack before Remove = %v, want %v", got, want)
	}
	if err := l.Remove(ctx, ep); err != nil {
		t.Fatal(err)
	}
	delete(want, 31)
	if got := ctCount(t, l); got[31] != 0 || got[32] != want[32] || got[3100] != want[3100] {
		t.Fatalf("conntrack after Remove = %v, want %v", got, want)
	}
	if err := l.Remove(ctx, ep); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	// The key-by-key fallback (kernels without batch lookups) agrees.
	if keys, err := ctKeysIterate(l.bpf.maps.ct, 32); err != nil || len(keys) != want[32] {
		t.Fatalf("ctKeysIterate(32) = %d keys, %v; want %d", len(keys), err, want[32])
	}
	if n, err := flushConntrack(l.bpf.maps.ct, 32); err != nil || n != want[32] {
		t.Fatalf("flushConntrack(32) = %d, %v; want %d", n, err, want[32])
	}
	if got := ctCount(t, l); got[32] != 0 || got[3100] != want[3100] {
		t.Fatalf("conntrack after flushing 32 = %v", got)
	}
}

// BenchmarkFlushConntrack is the conntrack part of Remove: one endpoint
// (none of whose entries exist) flushed from a conntrack map holding
// `entries` entries of other endpoints. Root; e.g.
// `CI=true go test -run '^$' -bench FlushConntrack -benchtime 50x ./datapath/`.
func BenchmarkFlushConntrack(b *testing.B) {
	for _, entries := range []int{0, 10000, 60000} {
		b.Run(strconv.Itoa(entries), func(b *testing.B) {
			testutil.RequireRoot(b)
			bs, err := openBPF(LinuxConfig{BPFFS: testutil.BPFFSDir(b)})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { bs.close() })
			keys := make([]bpf.EndpointCtKey, entries)
			vals := make([]bpf.EndpointCtValue, entries)
			for i := range keys {
				keys[i] = bpf.EndpointCtKey{Ep: uint16(1 + i%500), Dir: 1, Family: familyV4, Proto: 6, Sport: uint16(i), Dport: 80}
				keys[i].Saddr[0] = uint32(i)
			}
			if entries > 0 {
				if _, err := bs.maps.ct.BatchUpdate(keys, vals, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if n, err := flushConntrack(bs.maps.ct, 4000); err != nil || n != 0 {
					b.Fatalf("flush = %d, %v", n, err)
				}
			}
		})
	}
}
