package agent

import (
	"fmt"
	"slices"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent/metrics"
	"github.com/membrane-cni/membrane/pkg/domain/events"
)

// l7EventsPerSecond bounds the l7-access events published per second,
// for the reason dropEventsPerSecond bounds drops: a busy service would
// otherwise overwrite the event ring. The counter counts every request.
const l7EventsPerSecond = 1000

// l7Publisher turns the proxy's access records into l7-access events and
// counts them. It is called from the access socket's reader goroutine;
// its work is O(1) under a short mutex, never I/O.
type l7Publisher struct {
	hub *events.Hub
	m   *metrics.Metrics
	rateLimit
}

// onL7Access returns the datapath's LinuxHooks.OnL7Access.
func onL7Access(hub *events.Hub, m *metrics.Metrics) func(datapath.L7AccessEvent) {
	p := &l7Publisher{hub: hub, m: m, rateLimit: rateLimit{limit: l7EventsPerSecond, now: time.Now}}
	return p.access
}

func (p *l7Publisher) access(r datapath.L7AccessEvent) {
	ev := l7Event(r)
	dir := ev.L7.Direction
	if dir == "" {
		dir = "none"
	}
	p.m.L7Request(ev.L7.Protocol, ev.L7.Verdict, dir)
	ok, suppressed := p.admit()
	if !ok {
		return
	}
	if suppressed > 0 {
		ev.Message = fmt.Sprintf("%d earlier l7 access records not published (more than %d per second)", suppressed, p.limit)
	}
	p.hub.Publish(ev)
}

// l7Event converts an access record into its event.
func l7Event(r datapath.L7AccessEvent) events.Event {
	l := &events.L7{Protocol: "http", Verdict: "denied", Reason: r.Reason, Src: r.Src.String(), Dst: r.Dst.String(),
		SrcIdentity: r.SrcIdentity, DstIdentity: r.DstIdentity, Method: r.Method, Path: r.Path, Host: r.Host,
		HTTPVersion: r.Version, GRPC: r.GRPC, Code: r.Code, GRPCStatus: r.GRPCStatus,
		HeaderMismatches: slices.Clone(r.HeaderMismatches)}
	if r.Allowed {
		l.Verdict = "allowed"
	}
	if k := r.Kafka; k != nil {
		l.Protocol = "kafka"
		l.Kafka = &events.KafkaL7{APIKey: k.APIKey, APIVersion: k.APIVersion, CorrelationID: k.CorrelationID, ClientID: k.ClientID,
			Topics: slices.Clone(k.Topics), ErrorCode: k.ErrorCode}
	}
	if r.Endpoint != 0 {
		l.Direction = r.Direction
	}
	return events.Event{Type: events.L7Access, Time: r.Time, Endpoint: uint16(r.Endpoint), L7: l}
}
