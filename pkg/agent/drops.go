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
// work is O(1) under short mutexes, never I/O.
type dropPublisher struct {
	hub   *events.Hub
	m     *metrics.Metrics
	limit int
	now   func() time.Time

	// mu guards window, shown and suppressed.
	mu         sync.Mutex
	window     time.Time // start of the current one-second window
	shown      int       // events published in the window
	suppressed int       // notifications not published since the last event
}

// onDrop returns the datapath's LinuxHooks.OnDrop.
func onDrop(hub *events.Hub, m *metrics.Metrics) func(datapath.DropEvent) {
	p := &dropPublisher{hub: hub, m: m, limit: dropEventsPerSecond, now: time.Now}
	return p.drop
}

func (p *dropPublisher) drop(d datapath.DropEvent) {
	dir := d.Dir.String()
	p.m.Drop(d.Reason, dir)
	p.mu.Lock()
	now := p.now()
	if now.Sub(p.window) >= time.Second {
		p.window, p.shown = now, 0
	}
	if p.shown >= p.limit {
		p.suppressed++
		p.mu.Unlock()
		return
	}
	p.shown++
	ev := dropEvent(d, dir)
	if p.suppressed > 0 {
		ev.Message = fmt.Sprintf("%d earlier drop notifications not published (more than %d per second)", p.suppressed, p.limit)
		p.suppressed = 0
	}
	p.mu.Unlock()
	p.hub.Publish(ev)
}

// dropEvent converts a drop notification into its event.
func dropEvent(d datapath.DropEvent, dir string) events.Event {
	dr := &events.Drop{Reason: d.Reason, Direction: dir, SrcPort: d.SrcPort, DstPort: d.DstPort, Proto: d.Proto,
		PeerIdentity: uint32(d.PeerIdentity), Bytes: d.Length}
	if d.Src.IsValid() {
		dr.Src, dr.Dst = d.Src.String(), d.Dst.String()
	}
	return events.Event{Type: events.DatapathDrop, Time: d.Time, Endpoint: uint16(d.Endpoint), Drop: dr}
}
