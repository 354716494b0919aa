package agent

import (
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/events"
	"github.com/membrane-cni/membrane/pkg/metrics"
)

// onDrop returns the datapath's LinuxHooks.OnDrop: every drop
// notification becomes a datapath-drop event on hub and counts in m's
// drop counter. Both are O(1) under a short mutex, never I/O, so the
// ring-buffer reader is not held up.
func onDrop(hub *events.Hub, m *metrics.Metrics) func(datapath.DropEvent) {
	return func(d datapath.DropEvent) {
		dir := d.Dir.String()
		m.Drop(d.Reason, dir)
		hub.Publish(dropEvent(d, dir))
	}
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
