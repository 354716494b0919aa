package agent

import (
	"fmt"
	"sync"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent/metrics"
	"github.com/membrane-cni/membrane/pkg/domain/events"
)

// dropEventsPerSecond bounds the datapath-drop events published per
// second: a flood of denied packets would otherwise overwrite the whole
// event ring (8192 events) within milliseconds and every subscriber
// would miss the endpoint events in it. The Prometheus counter and the
// kernel's per-endpoint counters still count every drop.
const dropEventsPerSecond = 1000

// dropPublisher turns drop notifications into datapath-drop events and
// counts them. It is called from the ring-buffer reader goroutine; its
// work is O(1) under a short mutex, never I/O.
type dropPublisher struct {
	hub *events.Hub
	m   *metrics.Metrics
	rateLimit
}

// onDrop returns the datapath's LinuxHooks.OnDrop.
func onDrop(hub *events.Hub, m *metrics.Metrics) func(datapath.DropEvent) {
	p := &dropPublisher{hub: hub, m: m, rateLimit: rateLimit{limit: dropEventsPerSecond, now: time.Now}}
	return p.drop
}

func (p *dropPublisher) drop(d datapath.DropEvent) {
	dir := d.Dir.String()
	p.m.Drop(d.Reason, dir)
	ok, suppressed := p.admit()
	if !ok {
		return
	}
	ev := dropEvent(d, dir)
	if suppressed > 0 {
		ev.Message = fmt.Sprintf("%d earlier drop notifications not published (more than %d per second)", suppressed, p.limit)
	}
	p.hub.Publish(ev)
}

// rateLimit admits at most limit events per one-second window; the
// first admitted after a refusal learns how many were refused.
type rateLimit struct {
	limit int
	now   func() time.Time

	// mu guards window, shown and suppressed.
	mu         sync.Mutex
	window     time.Time // start of the current one-second window
	shown      int       // events admitted in the window
	suppressed int       // events refused since the last admitted one
}

// admit reports whether an event may be published now, and how many were
// refused since the last one admitted (reset by this call).
func (r *rateLimit) admit() (ok bool, suppressed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if now.Sub(r.window) >= time.Second {
		r.window, r.shown = now, 0
	}
	if r.shown >= r.limit {
		r.suppressed++
		return false, 0
	}
	r.shown++
	suppressed, r.suppressed = r.suppressed, 0
	return true, suppressed
}

// dropEvent converts a drop notification into its event.
func dropEvent(d datapath.DropEvent, dir string) events.Event {
	dr := &events.Drop{Reason: d.Reason, Direction: dir, SrcPort: d.SrcPort, DstPort: d.DstPort, Proto: d.Proto,
		PeerIdentity: uint32(d.PeerIdentity), Bytes: d.Length}
	if d.Src.IsValid() {
		dr.Src, dr.Dst = d.Src.String(), d.Dst.String()
	}
	typ := events.DatapathDrop
	if d.Reason == datapath.DropPolicyAudit {
		typ, dr.Verdict = events.PolicyVerdict, "audit"
	}
	return events.Event{Type: typ, Time: d.Time, Endpoint: uint16(d.Endpoint), Drop: dr}
}
