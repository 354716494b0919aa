package k8s

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// memSink is an in-memory RemoteSink: source -> address -> identity.
type memSink struct {
	mu       sync.Mutex
	ips      map[netip.Addr]identity.NumericIdentity
	replaces int
}

func (s *memSink) UpsertRemoteEndpoints(_ context.Context, _ string, eps []endpoint.Remote) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ep := range eps {
		for _, ip := range ep.IPs {
			s.ips[ip] = ep.Identity
		}
	}
	return nil
}

func (s *memSink) DeleteRemoteEndpoints(_ context.Context, _ string, ips []netip.Addr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ip := range ips {
		delete(s.ips, ip)
	}
	return nil
}

func (s *memSink) ReplaceRemoteEndpoints(ctx context.Context, src string, eps []endpoint.Remote) error {
	s.mu.Lock()
	s.ips = map[netip.Addr]identity.NumericIdentity{}
	s.replaces++
	s.mu.Unlock()
	return s.UpsertRemoteEndpoints(ctx, src, eps)
}

func mep(name, ip string, id int64) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": name, "namespace": "ns"},
		"status": map[string]any{"identity": map[string]any{"id": id},
			"networking": map[string]any{"ipv4": ip, "nodeName": "n2", "nodeIP": "192.0.2.2"}},
	}}
}

// TestRemoteStoreRounds: the store turns reflector calls into sink calls
// round by round: a relist replaces, an address that moved to another
// object survives the old object's deletion, objects without identity or
// address claim nothing, a tombstone deletes.
func TestRemoteStoreRounds(t *testing.T) {
	sink := &memSink{ips: map[netip.Addr]identity.NumericIdentity{}}
	r := newRemoteEndpoints(sink, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx := context.Background()
	a, b := netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("10.9.0.2")
	steps := []struct {
		name string
		do   func()
		want map[netip.Addr]identity.NumericIdentity
	}{
		{"relist", func() {
			_ = r.Replace([]any{mep("x", "10.9.0.1", 100), mep("bad", "", 101), mep("none", "10.9.0.3", 0)}, "1")
		},
			map[netip.Addr]identity.NumericIdentity{a: 100}},
		{"address moves to y", func() { _ = r.Add(mep("y", "10.9.0.1", 200)) },
			map[netip.Addr]identity.NumericIdentity{a: 200}},
		{"stale x deleted", func() { _ = r.Delete(mep("x", "10.9.0.1", 100)) },
			map[netip.Addr]identity.NumericIdentity{a: 200}},
		{"y changes address", func() { _ = r.Update(mep("y", "10.9.0.2", 200)) },
			map[netip.Addr]identity.NumericIdentity{b: 200}},
		{"y loses its identity", func() { _ = r.Update(mep("y", "10.9.0.2", 0)) },
			map[netip.Addr]identity.NumericIdentity{}},
		{"z added, then deleted by tombstone", func() {
			_ = r.Add(mep("z", "10.9.0.1", 300))
			_ = r.Delete(cache.DeletedFinalStateUnknown{Key: "ns/z"})
		}, map[netip.Addr]identity.NumericIdentity{}},
	}
	for _, st := range steps {
		st.do()
		if err := r.round(ctx); err != nil {
			t.Fatalf("%s: round: %v", st.name, err)
		}
		sink.mu.Lock()
		got := sink.ips
		sink.mu.Unlock()
		if len(got) != len(st.want) {
			t.Fatalf("%s: sink holds %v, want %v", st.name, got, st.want)
		}
		for ip, id := range st.want {
			if got[ip] != id {
				t.Fatalf("%s: sink holds %v, want %v", st.name, got, st.want)
			}
		}
	}
	if n, synced := r.stats(); n != 0 || !synced || sink.replaces != 1 {
		t.Fatalf("stats %d %v, replaces %d; want 0 held, synced, one replacement", n, synced, sink.replaces)
	}
}
