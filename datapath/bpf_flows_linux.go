package datapath

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// flowConfigOn is bpf/endpoint.h's FLOW_CONFIG_ON.
const flowConfigOn = 1

// setFlows writes the flow_config map the programs read for each new
// connection: on, they report flows; off, they report none. Nothing is
// reloaded or reattached.
func (b *bpfState) setFlows(on bool) error {
	v := bpf.EndpointFlowConfigValue{}
	if on {
		v.Flags = flowConfigOn
	}
	if err := b.maps.flowConfig.Update(uint32(0), v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write flow config: %w", err)
	}
	return nil
}

// SetFlows turns the endpoint programs' flow reports on or off at once,
// for every endpoint, without reloading anything (LinuxConfig.Flows).
func (l *Linux) SetFlows(on bool) error {
	if l.bpf == nil {
		return errors.New("set flows: the datapath is not initialised")
	}
	return l.bpf.setFlows(on)
}

// FlowStats sums the programs' per-CPU flow counters.
func (l *Linux) FlowStats() (FlowStats, error) {
	if l.bpf == nil {
		return FlowStats{}, errors.New("flow stats: the datapath is not initialised")
	}
	var per []bpf.EndpointFlowStatsValue
	if err := l.bpf.maps.flowStats.Lookup(uint32(0), &per); err != nil {
		return FlowStats{}, fmt.Errorf("read flow stats: %w", err)
	}
	var s FlowStats
	for _, v := range per {
		s.Reported += v.Flows
		s.FlowsLost += v.FlowsLost
		s.DropsLost += v.DropsLost
	}
	return s, nil
}

// readFlows delivers the programs' flow reports to LinuxHooks.OnFlow
// until the reader is closed.
func (l *Linux) readFlows(rd *ringbuf.Reader) {
	var rec ringbuf.Record
	for {
		if err := rd.ReadInto(&rec); err != nil {
			if errors.Is(err, ringbuf.ErrClosed) {
				return
			}
			l.log.Warn("reading flow reports", "err", err)
			continue
		}
		ev, ok := decodeFlow(rec.RawSample)
		if !ok {
			continue
		}
		l.mu.Lock()
		onFlow := l.hooks.OnFlow
		l.mu.Unlock()
		switch {
		case onFlow != nil:
			onFlow(ev)
		case l.log.Enabled(context.Background(), slog.LevelDebug):
			l.log.Debug("flow", "endpoint", ev.Endpoint, "verdict", ev.Verdict, "direction", ev.Dir.String(),
				"src", ev.Src, "dst", ev.Dst, "proto", ev.Proto, "dport", ev.DstPort, "peer-identity", ev.PeerIdentity)
		}
	}
}

// decodeFlow decodes one bpf flow_event.
func decodeFlow(raw []byte) (FlowEvent, bool) {
	var e bpf.EndpointFlowEvent
	if len(raw) < int(unsafe.Sizeof(e)) {
		return FlowEvent{}, false
	}
	if _, err := binary.Decode(raw, binary.NativeEndian, &e); err != nil {
		return FlowEvent{}, false
	}
	verdict, ok := flowVerdicts[e.Verdict]
	if !ok {
		return FlowEvent{}, false
	}
	ev := FlowEvent{
		Endpoint: endpoint.ID(e.Ep), Identity: identity.NumericIdentity(e.Identity), Verdict: verdict,
		Dir: policy.Direction(e.Dir), SrcPort: e.Sport, DstPort: e.Dport, Proto: e.Proto, TCPFlags: e.TcpFlags,
		PeerIdentity: identity.NumericIdentity(e.PeerIdentity), Hairpin: e.Flags&flowHairpin != 0,
		Enforced: e.Flags&flowEnforced != 0, Length: e.Len, Time: monoToWall(e.TimeNs),
	}
	if ev.Verdict == FlowRedirected {
		ev.ProxyPort = e.ProxyPort
	}
	ev.Src, ev.Dst = eventAddr(e.Family, e.Saddr), eventAddr(e.Family, e.Daddr)
	if e.Flags&flowTranslated != 0 {
		if a := eventAddr(e.Family, e.SvcAddr); a.IsValid() {
			ev.Frontend = netip.AddrPortFrom(a, e.SvcPort)
		}
	}
	return ev, true
}

// eventAddr is an event's address of family (invalid for non-IP).
func eventAddr(family uint8, w [4]uint32) netip.Addr {
	b := addrBytes(w)
	switch family {
	case familyV4:
		return netip.AddrFrom4([4]byte(b[:4]))
	case familyV6:
		return netip.AddrFrom16(b)
	}
	return netip.Addr{}
}
