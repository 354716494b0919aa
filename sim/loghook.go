package sim

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
)

// msgLeftToGC is what the endpoint actor logs when it gives up removing an
// endpoint's datapath (actors/endpoint_regen.go, removeDatapath). The
// harness has no other way to learn which endpoints were handed to the
// orphan garbage collector, so it watches the agent's log for it.
const msgLeftToGC = "datapath remove failed; leaving it to garbage collection"

// logHook is the agent's slog.Handler: it forwards records to the
// configured handler (or drops them) and collects the endpoints whose
// datapath removal was left to garbage collection.
type logHook struct {
	next  slog.Handler // nil: drop everything
	attrs []slog.Attr  // accumulated by WithAttrs
	state *hookState
}

type hookState struct {
	mu   sync.Mutex // guards gced
	gced map[endpoint.ID]bool
}

func newLogHook(next slog.Handler) *logHook {
	return &logHook{next: next, state: &hookState{gced: map[endpoint.ID]bool{}}}
}

var _ slog.Handler = (*logHook)(nil)

func (h *logHook) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelError || (h.next != nil && h.next.Enabled(ctx, l))
}

func (h *logHook) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError && r.Message == msgLeftToGC {
		h.noteGC(r)
	}
	if h.next == nil || !h.next.Enabled(ctx, r.Level) {
		return nil
	}
	return h.next.Handle(ctx, r)
}

func (h *logHook) noteGC(r slog.Record) {
	id, ok := endpointAttr(h.attrs)
	if !ok {
		r.Attrs(func(a slog.Attr) bool {
			id, ok = endpointAttr([]slog.Attr{a})
			return !ok
		})
	}
	if ok {
		h.state.mu.Lock()
		h.state.gced[id] = true
		h.state.mu.Unlock()
	}
}

func endpointAttr(attrs []slog.Attr) (endpoint.ID, bool) {
	for _, a := range attrs {
		if a.Key != "endpoint" {
			continue
		}
		v := a.Value.Resolve()
		switch v.Kind() {
		case slog.KindUint64:
			return endpoint.ID(v.Uint64()), true
		case slog.KindInt64:
			return endpoint.ID(v.Int64()), true
		case slog.KindAny:
			if id, ok := v.Any().(endpoint.ID); ok {
				return id, true
			}
		}
	}
	return 0, false
}

func (h *logHook) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := &logHook{next: h.next, attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...), state: h.state}
	if h.next != nil {
		c.next = h.next.WithAttrs(attrs)
	}
	return c
}

func (h *logHook) WithGroup(name string) slog.Handler {
	c := &logHook{next: h.next, attrs: h.attrs, state: h.state}
	if h.next != nil {
		c.next = h.next.WithGroup(name)
	}
	return c
}

// leftToGC returns the endpoints left to garbage collection so far (an ID
// may since belong to a new endpoint).
func (h *logHook) leftToGC() map[endpoint.ID]bool {
	h.state.mu.Lock()
	defer h.state.mu.Unlock()
	out := make(map[endpoint.ID]bool, len(h.state.gced))
	for id := range h.state.gced {
		out[id] = true
	}
	return out
}

// poolSize is the number of allocatable addresses of a prefix.
func poolSize(p netip.Prefix) int {
	r, err := ipam.NewRange(p, ipam.Sequential, nil)
	if err != nil {
		return 0
	}
	return r.Size()
}
