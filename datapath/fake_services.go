package datapath

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/membrane-cni/membrane/pkg/domain/service"
)

// fakeLB is the Fake's service maps.
type fakeLB struct {
	// mu guards everything below.
	mu       sync.Mutex
	services map[service.Frontend]LBService
	fault    error // returned by the next writes while set
	writes   int
}

var _ ServiceDatapath = (*Fake)(nil)

// SetServiceFault makes service writes fail with err (nil: succeed).
func (f *Fake) SetServiceFault(err error) {
	f.lb.mu.Lock()
	f.lb.fault = err
	f.lb.mu.Unlock()
}

// ServiceWrites counts the service writes that succeeded.
func (f *Fake) ServiceWrites() int {
	f.lb.mu.Lock()
	defer f.lb.mu.Unlock()
	return f.lb.writes
}

// FakeServices returns what the fake service maps hold.
func (f *Fake) FakeServices() map[service.Frontend]LBService {
	f.lb.mu.Lock()
	defer f.lb.mu.Unlock()
	out := make(map[service.Frontend]LBService, len(f.lb.services))
	for k, v := range f.lb.services {
		out[k] = v
	}
	return out
}

func (f *Fake) lbWrite(op string, fn func(m map[service.Frontend]LBService)) error {
	f.lb.mu.Lock()
	defer f.lb.mu.Unlock()
	if f.lb.fault != nil {
		return fmt.Errorf("%s: %w", op, f.lb.fault)
	}
	if f.lb.services == nil {
		f.lb.services = make(map[service.Frontend]LBService)
	}
	fn(f.lb.services)
	f.lb.writes++
	return nil
}

// UpsertService implements ServiceDatapath.
func (f *Fake) UpsertService(_ context.Context, s LBService, _ int) error {
	s.Backends = slices.Clone(s.Backends)
	return f.lbWrite("upsert service "+s.Frontend.String(), func(m map[service.Frontend]LBService) { m[s.Frontend] = s })
}

// DeleteService implements ServiceDatapath.
func (f *Fake) DeleteService(_ context.Context, fe service.Frontend, _ uint32, _ int) error {
	return f.lbWrite("delete service "+fe.String(), func(m map[service.Frontend]LBService) { delete(m, fe) })
}

// SyncServices implements ServiceDatapath.
func (f *Fake) SyncServices(_ context.Context, desired []LBService) error {
	return f.lbWrite("sync services", func(m map[service.Frontend]LBService) {
		clear(m)
		for _, s := range desired {
			s.Backends = slices.Clone(s.Backends)
			m[s.Frontend] = s
		}
	})
}

// DumpServices implements ServiceDatapath.
func (f *Fake) DumpServices(context.Context) (LBMaps, error) {
	f.lb.mu.Lock()
	defer f.lb.mu.Unlock()
	var out LBMaps
	for _, s := range f.lb.services {
		out.Frontends = append(out.Frontends, LBFrontendEntry{Frontend: s.Frontend, ID: s.ID, Count: uint32(len(s.Backends)),
			Affinity: uint32(s.Affinity.Seconds()), External: s.External, TwoScopes: s.TwoScopes})
		for i, b := range s.Backends {
			out.Backends = append(out.Backends, LBBackendEntry{ID: s.ID, Slot: uint32(i + 1), Backend: b})
		}
	}
	sortLBMaps(&out)
	return out, nil
}

// sortLBMaps orders frontends by frontend and backends by ID and slot.
func sortLBMaps(m *LBMaps) {
	slices.SortFunc(m.Frontends, func(a, b LBFrontendEntry) int { return a.Frontend.Compare(b.Frontend) })
	slices.SortFunc(m.Backends, func(a, b LBBackendEntry) int {
		if a.ID != b.ID {
			return int(int64(a.ID) - int64(b.ID))
		}
		return int(int64(a.Slot) - int64(b.Slot))
	})
}
