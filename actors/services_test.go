package actors_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
	"github.com/membrane-cni/membrane/pkg/domain/service"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

func testService(vip string, port uint16, backends ...string) service.Service {
	s := service.Service{
		Frontend: service.Frontend{Addr: netip.MustParseAddr(vip), Port: port, Proto: service.TCP},
		Name:     "default/db", Kind: service.KindClusterIP,
	}
	for _, b := range backends {
		s.Backends = append(s.Backends, service.Backend{Addr: netip.MustParseAddr(b), Port: 8080})
	}
	return s
}

func TestServicesUpsertDeleteReplace(t *testing.T) {
	h := startSystem(t, nil)
	ctx := context.Background()
	a := testService("10.96.0.10", 80, "10.200.0.5", "10.200.0.6")
	b := testService("fd00:96::10", 80, "fd00:200::5")
	res, err := h.sys.UpsertServices(ctx, "k8s", []service.Service{a, b})
	if err != nil || res.Upserted != 2 {
		t.Fatalf("UpsertServices = %+v, %v; want 2 upserted", res, err)
	}
	held := h.fake.FakeServices()
	if got := held[a.Frontend]; len(got.Backends) != 2 || got.ID == 0 {
		t.Fatalf("datapath holds %+v for %s, want 2 backends and an ID", got, a.Frontend)
	}
	row, ok := h.ix.Service(a.Frontend)
	if !ok || row.State != index.ServiceRealized || row.Source != "k8s" {
		t.Fatalf("row = %+v, %v; want realized from k8s", row, ok)
	}
	if held[a.Frontend].ID == held[b.Frontend].ID {
		t.Errorf("two frontends share ID %d", held[a.Frontend].ID)
	}
	// Another source may not take the frontend.
	if _, err := h.sys.UpsertService(ctx, "api", a); !errors.Is(err, service.ErrConflict) {
		t.Errorf("UpsertService from another source = %v, want ErrConflict", err)
	}
	// Shrinking keeps the ID.
	id := held[a.Frontend].ID
	a.Backends = a.Backends[1:]
	if _, err := h.sys.UpsertService(ctx, "k8s", a); err != nil {
		t.Fatal(err)
	}
	if got := h.fake.FakeServices()[a.Frontend]; got.ID != id || len(got.Backends) != 1 {
		t.Errorf("after shrinking: %+v, want ID %d with 1 backend", got, id)
	}
	// Replace with only b: a goes.
	res, err = h.sys.ReplaceServices(ctx, "k8s", []service.Service{b})
	if err != nil || res.Deleted != 1 || res.Upserted != 0 {
		t.Fatalf("ReplaceServices = %+v, %v; want 1 deleted, 0 upserted", res, err)
	}
	if _, ok := h.fake.FakeServices()[a.Frontend]; ok {
		t.Errorf("datapath still holds %s", a.Frontend)
	}
	if _, ok := h.ix.Service(a.Frontend); ok {
		t.Errorf("index still holds %s", a.Frontend)
	}
	if _, err := h.sys.DeleteService(ctx, "k8s", b.Frontend); err != nil {
		t.Fatal(err)
	}
	if n := len(h.fake.FakeServices()); n != 0 {
		t.Errorf("datapath holds %d services after deleting all", n)
	}
}

func TestServicesRefuseBadInput(t *testing.T) {
	h := startSystem(t, nil)
	ctx := context.Background()
	good := testService("10.96.0.10", 80, "10.200.0.5")
	for name, mutate := range map[string]func(*service.Service){
		"port 0":          func(s *service.Service) { s.Frontend.Port = 0 },
		"sctp":            func(s *service.Service) { s.Frontend.Proto = service.SCTP },
		"mixed family":    func(s *service.Service) { s.Backends[0].Addr = netip.MustParseAddr("fd00::1") },
		"backend port 0":  func(s *service.Service) { s.Backends[0].Port = 0 },
		"kind":            func(s *service.Service) { s.Kind = "Magic" },
		"affinity":        func(s *service.Service) { s.Affinity = -time.Second },
		"duplicate":       func(s *service.Service) { s.Backends = append(s.Backends, s.Backends[0]) },
		"unspecified vip": func(s *service.Service) { s.Frontend.Addr = netip.IPv4Unspecified() },
	} {
		t.Run(name, func(t *testing.T) {
			s := good
			s.Backends = append([]service.Backend(nil), good.Backends...)
			mutate(&s)
			if _, err := h.sys.UpsertService(ctx, "k8s", s); !errors.Is(err, service.ErrInvalid) {
				t.Errorf("UpsertService = %v, want ErrInvalid", err)
			}
		})
	}
	if _, err := h.sys.UpsertService(ctx, "Bad Source", good); !errors.Is(err, service.ErrInvalid) {
		t.Errorf("bad source: %v, want ErrInvalid", err)
	}
	if n := len(h.ix.Services()); n != 0 {
		t.Errorf("index holds %d services after refusals", n)
	}
}

func TestServicesRetryFailedWrites(t *testing.T) {
	h := startSystem(t, nil)
	ctx := context.Background()
	h.fake.SetServiceFault(datapath.ErrInjected)
	a := testService("10.96.0.11", 53, "10.200.0.7")
	if _, err := h.sys.UpsertService(ctx, "k8s", a); !errors.Is(err, datapath.ErrInjected) {
		t.Fatalf("UpsertService with a failing datapath = %v, want ErrInjected", err)
	}
	if row, _ := h.ix.Service(a.Frontend); row == nil || row.State != index.ServiceFailed {
		t.Fatalf("row = %+v, want failed", row)
	}
	h.fake.SetServiceFault(nil)
	testutil.Eventually(t, "the retried write", func() bool {
		row, _ := h.ix.Service(a.Frontend)
		return row != nil && row.State == index.ServiceRealized && len(h.fake.FakeServices()) == 1
	})
}

// TestServicesReconcilerInSnapshot: the services actor's snapshot (GET
// /v1/actors) shows a failing frontend while the datapath refuses it, and
// nothing pending once the retry wrote it.
func TestServicesReconcilerInSnapshot(t *testing.T) {
	h := startSystem(t, nil)
	reconciler := func() *actors.ReconcilerSnapshot {
		s, ok := h.sys.Registry().Get("agent/services")
		if !ok {
			t.Fatal("no services actor in the registry")
		}
		return s.Reconciler
	}
	h.fake.SetServiceFault(datapath.ErrInjected)
	a := testService("10.96.0.14", 53, "10.200.0.7")
	if _, err := h.sys.UpsertService(context.Background(), "k8s", a); !errors.Is(err, datapath.ErrInjected) {
		t.Fatalf("UpsertService with a failing datapath = %v, want ErrInjected", err)
	}
	testutil.Eventually(t, "the failing write in the snapshot", func() bool {
		r := reconciler()
		return r != nil && r.Pending == 1 && r.Failed == 1 && r.Failures >= 1 && strings.Contains(r.LastError, datapath.ErrInjected.Error())
	})
	h.fake.SetServiceFault(nil)
	testutil.Eventually(t, "nothing pending after the retry", func() bool {
		r := reconciler()
		return r != nil && *r == actors.ReconcilerSnapshot{}
	})
}

// TestServicesAdoptIDs: a new agent reuses the IDs the maps hold for the
// same frontends and prune removes what no source re-declared.
func TestServicesAdoptIDs(t *testing.T) {
	fake := datapath.NewFake(1)
	a := testService("10.96.0.12", 80, "10.200.0.8")
	stale := testService("10.96.0.13", 80, "10.200.0.9")
	ctx := context.Background()
	if err := fake.SyncServices(ctx, []datapath.LBService{
		{ID: 7, Frontend: a.Frontend, Backends: a.Backends},
		{ID: 1, Frontend: stale.Frontend, Backends: stale.Backends},
	}); err != nil {
		t.Fatal(err)
	}
	h := startSystemOn(t, fake)
	b := testService("10.96.0.14", 80, "10.200.0.10")
	if _, err := h.sys.UpsertServices(ctx, "k8s", []service.Service{b, a}); err != nil {
		t.Fatal(err)
	}
	held := h.fake.FakeServices()
	if held[a.Frontend].ID != 7 {
		t.Errorf("adopted frontend got ID %d, want 7", held[a.Frontend].ID)
	}
	if held[b.Frontend].ID == 1 || held[b.Frontend].ID == 7 {
		t.Errorf("new frontend got an adopted ID %d", held[b.Frontend].ID)
	}
	h.sys.PruneServices()
	testutil.Eventually(t, "the prune", func() bool { _, ok := h.fake.FakeServices()[stale.Frontend]; return !ok })
	if n := len(h.fake.FakeServices()); n != 2 {
		t.Errorf("after prune the datapath holds %d services, want 2", n)
	}
}

// startSystemOn starts an actor system like startSystem on fake.
func startSystemOn(tb testing.TB, fake *datapath.Fake) *harness {
	tb.Helper()
	ix, err := index.New()
	if err != nil {
		tb.Fatal(err)
	}
	cfg := actors.Config{
		IPAM:     actors.IPAMConfig{IPv4: testIPv4, IPv6: testIPv6, Strategy: ipam.Sequential, Seed: 1},
		Pool:     actors.PoolConfig{Workers: 4},
		Endpoint: actors.EndpointConfig{RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond},
	}
	sys, err := actors.Start(cfg, ix, fake, testLogger(tb))
	if err != nil {
		tb.Fatalf("actors.Start: %v", err)
	}
	tb.Cleanup(sys.Stop)
	return &harness{sys: sys, fake: fake, ix: ix}
}
