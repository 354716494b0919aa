package datapath

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net/netip"
	"time"
	"unsafe"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// readDrops delivers the programs' drop notifications to
// LinuxHooks.OnDrop until the reader is closed.
func (l *Linux) readDrops(rd *ringbuf.Reader) {
	var rec ringbuf.Record
	for {
		if err := rd.ReadInto(&rec); err != nil {
			if errors.Is(err, ringbuf.ErrClosed) {
				return
			}
			l.log.Warn("reading drop notifications", "err", err)
			continue
		}
		ev, ok := decodeDrop(rec.RawSample)
		if !ok {
			continue
		}
		l.mu.Lock()
		onDrop := l.hooks.OnDrop
		l.mu.Unlock()
		switch {
		case onDrop != nil:
			onDrop(ev)
		case l.log.Enabled(context.Background(), slog.LevelDebug):
			l.log.Debug("packet dropped", "endpoint", ev.Endpoint, "reason", ev.Reason, "direction", ev.Dir.String(),
				"src", ev.Src, "dst", ev.Dst, "proto", ev.Proto, "dport", ev.DstPort, "peer-identity", ev.PeerIdentity)
		}
	}
}

// decodeDrop decodes one bpf drop_event.
func decodeDrop(raw []byte) (DropEvent, bool) {
	var e bpf.EndpointDropEvent
	if len(raw) < int(unsafe.Sizeof(e)) {
		return DropEvent{}, false
	}
	if _, err := binary.Decode(raw, binary.NativeEndian, &e); err != nil {
		return DropEvent{}, false
	}
	ev := DropEvent{
		Endpoint: endpoint.ID(e.Ep), Reason: dropReasonName(e.Reason), Dir: policy.Direction(e.Dir),
		SrcPort: e.Sport, DstPort: e.Dport, Proto: e.Proto, TCPFlags: e.TcpFlags,
		PeerIdentity: identity.NumericIdentity(e.PeerIdentity), Length: e.Len, Time: monoToWall(e.TimeNs),
	}
	switch e.Family {
	case familyV4:
		s, d := addrBytes(e.Saddr), addrBytes(e.Daddr)
		ev.Src, ev.Dst = netip.AddrFrom4([4]byte(s[:4])), netip.AddrFrom4([4]byte(d[:4]))
	case familyV6:
		ev.Src, ev.Dst = netip.AddrFrom16(addrBytes(e.Saddr)), netip.AddrFrom16(addrBytes(e.Daddr))
	}
	return ev, true
}

// monoToWall converts a CLOCK_MONOTONIC time (bpf_ktime_get_ns) to wall
// time.
func monoToWall(ns uint64) time.Time {
	var ts unix.Timespec
	now := time.Now()
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return now
	}
	return now.Add(-time.Duration(uint64(ts.Nano()) - ns))
}
