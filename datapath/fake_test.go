package datapath

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// ackRecorder collects proxy acknowledgements delivered by a Fake.
type ackRecorder struct {
	mu   sync.Mutex
	acks []string
	got  chan struct{}
}

func newAckRecorder(tb testing.TB, f *Fake) *ackRecorder {
	tb.Helper()
	r := &ackRecorder{got: make(chan struct{}, 1024)}
	f.SetProxyAck(func(id endpoint.ID, rev uint64, proxy string) {
		r.mu.Lock()
		r.acks = append(r.acks, proxy)
		r.mu.Unlock()
		r.got <- struct{}{}
		_, _ = id, rev
	})
	tb.Cleanup(func() { f.SetProxyAck(nil) })
	return r
}

func (r *ackRecorder) waitN(tb testing.TB, n int) []string {
	tb.Helper()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	for range n {
		select {
		case <-r.got:
		case <-timer.C:
			tb.Fatalf("timed out waiting for %d proxy acknowledgements", n)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := slices.Clone(r.acks)
	slices.Sort(out)
	return out
}

func fakeEP(id endpoint.ID) *endpoint.Endpoint {
	return &endpoint.Endpoint{ID: id, State: endpoint.StateRegenerating}
}

func TestFakeLifecycle(t *testing.T) {
	f := NewFake(1)
	ctx := context.Background()
	if f.Name() != "fake" {
		t.Errorf("Name() = %q", f.Name())
	}
	if err := f.Init(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.Check(ctx, fakeEP(1)); !errors.Is(err, ErrEndpointMissing) {
		t.Fatalf("Check before Realize = %v, want ErrEndpointMissing", err)
	}
	for rev := uint64(1); rev <= 2; rev++ {
		r, err := f.Realize(ctx, fakeEP(1), rev)
		if err != nil || len(r.ProxyWaits) != 0 {
			t.Fatalf("Realize rev %d = %+v, %v", rev, r, err)
		}
		if got, ok := f.Realized(1); !ok || got != rev {
			t.Fatalf("Realized(1) = %d, %v; want %d", got, ok, rev)
		}
	}
	if err := f.Check(ctx, fakeEP(1)); err != nil {
		t.Fatalf("Check after Realize = %v", err)
	}
	if live, realizes, removes := f.Stats(); live != 1 || realizes != 2 || removes != 0 {
		t.Fatalf("Stats() = %d, %d, %d", live, realizes, removes)
	}

	f.Forget(1)
	if err := f.Check(ctx, fakeEP(1)); !errors.Is(err, ErrEndpointMissing) {
		t.Fatalf("Check after Forget = %v, want ErrEndpointMissing", err)
	}
	// Remove is idempotent: a missing endpoint is success.
	for range 2 {
		if err := f.Remove(ctx, fakeEP(1)); err != nil {
			t.Fatalf("Remove = %v", err)
		}
	}
	if _, ok := f.Realized(1); ok {
		t.Errorf("Realized after Remove")
	}
	if live, _, removes := f.Stats(); live != 0 || removes != 2 {
		t.Errorf("Stats() live %d removes %d", live, removes)
	}
	if err := f.Close(); err != nil {
		t.Errorf("Close() = %v", err)
	}
}

func TestFakeHooks(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name       string
		hooks      FakeHooks
		op         func(f *Fake, ctx context.Context) error
		wantErr    error
		wantCalled bool
	}{
		{
			name:       "before realize error",
			hooks:      FakeHooks{BeforeRealize: func(context.Context, *endpoint.Endpoint, uint64) error { return boom }},
			op:         func(f *Fake, ctx context.Context) error { _, err := f.Realize(ctx, fakeEP(3), 1); return err },
			wantErr:    boom,
			wantCalled: false,
		},
		{
			name:       "before realize ok",
			hooks:      FakeHooks{BeforeRealize: func(context.Context, *endpoint.Endpoint, uint64) error { return nil }},
			op:         func(f *Fake, ctx context.Context) error { _, err := f.Realize(ctx, fakeEP(3), 1); return err },
			wantCalled: true,
		},
		{
			name:    "before remove error",
			hooks:   FakeHooks{BeforeRemove: func(context.Context, *endpoint.Endpoint) error { return boom }},
			op:      func(f *Fake, ctx context.Context) error { return f.Remove(ctx, fakeEP(3)) },
			wantErr: boom,
		},
		{
			name:    "realize delay honours the context",
			hooks:   FakeHooks{RealizeDelay: time.Hour},
			op:      func(f *Fake, ctx context.Context) error { _, err := f.Realize(ctx, fakeEP(3), 1); return err },
			wantErr: context.Canceled,
		},
		{
			name:    "remove delay honours the context",
			hooks:   FakeHooks{RemoveDelay: time.Hour},
			op:      func(f *Fake, ctx context.Context) error { return f.Remove(ctx, fakeEP(3)) },
			wantErr: context.Canceled,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := NewFake(1)
			f.Set(tt.hooks)
			if got := f.Hooks(); (got.BeforeRealize != nil) != (tt.hooks.BeforeRealize != nil) || got.RealizeDelay != tt.hooks.RealizeDelay {
				t.Fatalf("Hooks() does not return what Set stored")
			}
			ctx, cancel := context.WithCancel(context.Background())
			if tt.wantErr == context.Canceled {
				cancel()
			}
			defer cancel()
			err := tt.op(f, ctx)
			if tt.wantErr == nil && err != nil {
				t.Fatalf("op = %v", err)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("op = %v, want %v", err, tt.wantErr)
			}
			if _, ok := f.Realized(3); ok != tt.wantCalled {
				t.Errorf("Realized(3) = %v, want %v", ok, tt.wantCalled)
			}
		})
	}
}

func TestFakeHookSeesEndpointAndRevision(t *testing.T) {
	f := NewFake(1)
	var gotID endpoint.ID
	var gotRev uint64
	f.Set(FakeHooks{BeforeRealize: func(_ context.Context, e *endpoint.Endpoint, rev uint64) error {
		gotID, gotRev = e.ID, rev
		return nil
	}})
	if _, err := f.Realize(context.Background(), fakeEP(9), 42); err != nil {
		t.Fatal(err)
	}
	if gotID != 9 || gotRev != 42 {
		t.Fatalf("hook saw endpoint %d revision %d", gotID, gotRev)
	}
}

// failures runs n Realize calls and records which failed.
func fakeFailures(tb testing.TB, f *Fake, n int) []bool {
	tb.Helper()
	out := make([]bool, n)
	for i := range out {
		_, err := f.Realize(context.Background(), fakeEP(endpoint.ID(i%100+1)), 1)
		if err != nil && !errors.Is(err, ErrInjected) {
			tb.Fatalf("Realize: %v, want nil or ErrInjected", err)
		}
		out[i] = err != nil
	}
	return out
}

func TestFakeErrorRate(t *testing.T) {
	tests := []struct {
		name     string
		rate     float64
		min, max int // failures out of 1000
	}{
		{"never", 0, 0, 0},
		{"always", 1, 1000, 1000},
		{"half", 0.5, 400, 600},
		{"tenth", 0.1, 50, 150},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := NewFake(42)
			f.Set(FakeHooks{ErrorRate: tt.rate})
			n := 0
			for _, failed := range fakeFailures(t, f, 1000) {
				if failed {
					n++
				}
			}
			if n < tt.min || n > tt.max {
				t.Fatalf("%d failures of 1000 at rate %v, want %d..%d", n, tt.rate, tt.min, tt.max)
			}
			_, realizes, _ := f.Stats()
			if realizes != uint64(1000-n) {
				t.Errorf("Stats realizes = %d, want %d successes", realizes, 1000-n)
			}
		})
	}
	t.Run("same seed same faults", func(t *testing.T) {
		a, b := NewFake(7), NewFake(7)
		a.Set(FakeHooks{ErrorRate: 0.3})
		b.Set(FakeHooks{ErrorRate: 0.3})
		if !slices.Equal(fakeFailures(t, a, 300), fakeFailures(t, b, 300)) {
			t.Fatalf("two fakes with seed 7 injected different faults")
		}
	})
	t.Run("other seed other faults", func(t *testing.T) {
		a, b := NewFake(7), NewFake(8)
		a.Set(FakeHooks{ErrorRate: 0.3})
		b.Set(FakeHooks{ErrorRate: 0.3})
		if slices.Equal(fakeFailures(t, a, 300), fakeFailures(t, b, 300)) {
			t.Fatalf("seeds 7 and 8 injected the same 300 faults")
		}
	})
	t.Run("remove fails too", func(t *testing.T) {
		f := NewFake(1)
		f.Set(FakeHooks{ErrorRate: 1})
		if err := f.Remove(context.Background(), fakeEP(1)); !errors.Is(err, ErrInjected) {
			t.Fatalf("Remove = %v, want ErrInjected", err)
		}
	})
}

func TestFakeProxyAcks(t *testing.T) {
	t.Run("delivered", func(t *testing.T) {
		f := NewFake(1)
		rec := newAckRecorder(t, f)
		f.Set(FakeHooks{ProxyAcks: 3, ProxyAckDelay: time.Millisecond})
		r, err := f.Realize(context.Background(), fakeEP(5), 7)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"proxy-0", "proxy-1", "proxy-2"}
		if got := slices.Sorted(slices.Values(r.ProxyWaits)); !slices.Equal(got, want) {
			t.Fatalf("ProxyWaits = %v, want %v", r.ProxyWaits, want)
		}
		if got := rec.waitN(t, 3); !slices.Equal(got, want) {
			t.Fatalf("acks = %v, want %v", got, want)
		}
	})
	t.Run("identifies endpoint and revision", func(t *testing.T) {
		f := NewFake(1)
		type ack struct {
			id  endpoint.ID
			rev uint64
		}
		got := make(chan ack, 1)
		f.SetProxyAck(func(id endpoint.ID, rev uint64, _ string) { got <- ack{id, rev} })
		f.Set(FakeHooks{ProxyAcks: 1})
		if _, err := f.Realize(context.Background(), fakeEP(11), 99); err != nil {
			t.Fatal(err)
		}
		select {
		case a := <-got:
			if a.id != 11 || a.rev != 99 {
				t.Fatalf("ack for endpoint %d revision %d, want 11/99", a.id, a.rev)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no ack")
		}
	})
	t.Run("dropped", func(t *testing.T) {
		f := NewFake(1)
		calls := 0
		var mu sync.Mutex
		f.SetProxyAck(func(endpoint.ID, uint64, string) { mu.Lock(); calls++; mu.Unlock() })
		f.Set(FakeHooks{ProxyAcks: 2, ProxyAckDropRate: 1})
		r, err := f.Realize(context.Background(), fakeEP(5), 1)
		if err != nil {
			t.Fatal(err)
		}
		// The waits are still announced: the agent has to time out.
		if len(r.ProxyWaits) != 2 {
			t.Fatalf("ProxyWaits = %v, want 2 proxies", r.ProxyWaits)
		}
		// With zero delay an undropped ack would be scheduled at once; run a
		// second, undropped realize and wait for its acks, after which the
		// dropped ones would have arrived too.
		rec := make(chan struct{}, 2)
		f.SetProxyAck(func(endpoint.ID, uint64, string) { rec <- struct{}{} })
		f.Set(FakeHooks{ProxyAcks: 2})
		if _, err := f.Realize(context.Background(), fakeEP(6), 1); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			select {
			case <-rec:
			case <-time.After(10 * time.Second):
				t.Fatal("undropped acks never arrived")
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if calls != 0 {
			t.Fatalf("%d acks delivered at drop rate 1", calls)
		}
	})
	t.Run("no ack function", func(t *testing.T) {
		f := NewFake(1)
		f.Set(FakeHooks{ProxyAcks: 2})
		r, err := f.Realize(context.Background(), fakeEP(5), 1)
		if err != nil || len(r.ProxyWaits) != 2 {
			t.Fatalf("Realize = %+v, %v", r, err)
		}
	})
	t.Run("failed realize sends none", func(t *testing.T) {
		f := NewFake(1)
		calls := make(chan struct{}, 4)
		f.SetProxyAck(func(endpoint.ID, uint64, string) { calls <- struct{}{} })
		f.Set(FakeHooks{ProxyAcks: 2, ErrorRate: 1})
		r, err := f.Realize(context.Background(), fakeEP(5), 1)
		if !errors.Is(err, ErrInjected) || len(r.ProxyWaits) != 0 {
			t.Fatalf("Realize = %+v, %v", r, err)
		}
		select {
		case <-calls:
			t.Fatal("ack delivered for a failed realize")
		default:
		}
	})
}

func TestFakeConcurrent(t *testing.T) {
	f := NewFake(3)
	f.Set(FakeHooks{ErrorRate: 0.2, ProxyAcks: 1})
	f.SetProxyAck(func(endpoint.ID, uint64, string) {})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for i := range 200 {
				id := endpoint.ID(w*1000 + i + 1)
				_, _ = f.Realize(ctx, fakeEP(id), uint64(i))
				_ = f.Check(ctx, fakeEP(id))
				_ = f.Remove(ctx, fakeEP(id))
				f.Forget(id)
			}
		}()
	}
	wg.Wait()
	if live, _, _ := f.Stats(); live != 0 {
		t.Fatalf("%d endpoints left", live)
	}
}
