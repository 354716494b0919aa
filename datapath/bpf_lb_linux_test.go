package datapath

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/service"
)

func lbSvc(id uint32, vip string, n int) LBService {
	s := LBService{ID: id, Frontend: service.Frontend{Addr: netip.MustParseAddr(vip), Port: 80, Proto: service.TCP}}
	for i := range n {
		a := netip.MustParseAddr(vip).As4()
		a[3] = byte(100 + i)
		s.Backends = append(s.Backends, service.Backend{Addr: netip.AddrFrom4(a), Port: 8080})
	}
	return s
}

// TestLBMapsWriteAndDump writes, shrinks, deletes and syncs services in
// the pinned maps and reads them back.
func TestLBMapsWriteAndDump(t *testing.T) {
	l, _, _ := newTestLinux(t, LinuxConfig{})
	ctx := context.Background()
	a, b := lbSvc(1, "10.96.0.1", 3), lbSvc(2, "10.96.0.2", 1)
	b.Affinity = 90 * time.Second
	for _, s := range []LBService{a, b} {
		if err := l.UpsertService(ctx, s, 0); err != nil {
			t.Fatal(err)
		}
	}
	shrunk := a
	shrunk.Backends = a.Backends[1:]
	if err := l.UpsertService(ctx, shrunk, len(a.Backends)); err != nil {
		t.Fatal(err)
	}
	m, err := l.DumpServices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []LBFrontendEntry{{Frontend: a.Frontend, ID: 1, Count: 2}, {Frontend: b.Frontend, ID: 2, Count: 1, Affinity: 90}}
	if !slices.Equal(m.Frontends, want) {
		t.Errorf("frontends = %+v, want %+v", m.Frontends, want)
	}
	wantB := []LBBackendEntry{{1, 1, a.Backends[1]}, {1, 2, a.Backends[2]}, {2, 1, b.Backends[0]}}
	if !slices.Equal(m.Backends, wantB) {
		t.Errorf("backends = %+v, want %+v (slot 3 of service 1 must be gone)", m.Backends, wantB)
	}
	if err := l.DeleteService(ctx, b.Frontend, 2, 1); err != nil {
		t.Fatal(err)
	}
	if err := l.DeleteService(ctx, b.Frontend, 2, 1); err != nil {
		t.Errorf("deleting a missing service: %v", err)
	}
	c := lbSvc(3, "fd00:96::3", 0)
	c.Frontend.Addr = netip.MustParseAddr("fd00:96::3")
	c.Backends = []service.Backend{{Addr: netip.MustParseAddr("fd00::7"), Port: 53}}
	if err := l.SyncServices(ctx, []LBService{c}); err != nil {
		t.Fatal(err)
	}
	m, err = l.DumpServices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Frontends) != 1 || m.Frontends[0].Frontend != c.Frontend || len(m.Backends) != 1 || m.Backends[0].Backend != c.Backends[0] {
		t.Errorf("after sync: %+v, want only %+v", m, c)
	}
}

// TestLBMapWriteTimes logs the time of one service write (4 backends)
// among 1,000 services (BENCHMARKS.md "Services"); only with
// MEMBRANE_BENCH_SERVICES=1.
func TestLBMapWriteTimes(t *testing.T) {
	if os.Getenv("MEMBRANE_BENCH_SERVICES") == "" {
		t.Skip("a benchmark: set MEMBRANE_BENCH_SERVICES=1")
	}
	l, _, _ := newTestLinux(t, LinuxConfig{})
	ctx := context.Background()
	const n = 1000
	for i := range n {
		if err := l.UpsertService(ctx, lbSvc(uint32(i+1), fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), 4), 0); err != nil {
			t.Fatal(err)
		}
	}
	var took []time.Duration
	for r := range 5000 {
		i := r % n
		s := lbSvc(uint32(i+1), fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), 3+r%2)
		start := time.Now()
		if err := l.UpsertService(ctx, s, 4); err != nil {
			t.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	b, _ := os.ReadFile("/proc/loadavg")
	t.Logf("UpsertService among %d services: n=%d p50 %v p99 %v max %v; load average %s", n, len(took), took[len(took)/2], took[len(took)*99/100], took[len(took)-1], b)
}
