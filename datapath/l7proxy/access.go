package l7proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"
)

// AccessRecord is one request the proxy decided. The proxy sends each
// as a JSON datagram to the agent's access socket (AccessServer); the
// agent publishes it (events, metrics). Fields as in events.L7.
type AccessRecord struct {
	Time time.Time `json:"time"`
	// Endpoint is the endpoint whose rules decided (0: none had rules),
	// Direction theirs ("ingress", "egress").
	Endpoint    uint64         `json:"endpoint"`
	Direction   string         `json:"direction"`
	Src         netip.AddrPort `json:"src"`
	Dst         netip.AddrPort `json:"dst"`
	SrcIdentity uint32         `json:"srcIdentity"`
	DstIdentity uint32         `json:"dstIdentity"`
	Method      string         `json:"method,omitempty"`
	Path        string         `json:"path,omitempty"`
	Host        string         `json:"host,omitempty"`
	Allowed     bool           `json:"allowed"`
	Reason      string         `json:"reason,omitempty"`
}

// accessQueue bounds the records waiting for the writer: a request
// never waits for the agent; a full queue drops the record (counted).
const accessQueue = 4096

// maxAccessDatagram bounds one record (the path and host are the
// client's; longer records are cut to their first bytes by truncation
// of the path).
const maxAccessDatagram = 16 << 10

// accessLog sends access records to the agent from one goroutine.
type accessLog struct {
	path    string
	ch      chan AccessRecord
	dropped atomic.Uint64
}

func newAccessLog(path string) *accessLog {
	return &accessLog{path: path, ch: make(chan AccessRecord, accessQueue)}
}

// log queues r without blocking.
func (a *accessLog) log(r AccessRecord) {
	if a.path == "" {
		return
	}
	select {
	case a.ch <- r:
	default:
		a.dropped.Add(1)
	}
}

// run writes queued records until ctx ends, (re)connecting to the
// agent's socket as needed; a record that cannot be sent is dropped.
func (a *accessLog) run(ctx context.Context) {
	if a.path == "" {
		return
	}
	var conn *net.UnixConn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for {
		var r AccessRecord
		select {
		case <-ctx.Done():
			return
		case r = <-a.ch:
		}
		if len(r.Path) > maxAccessDatagram/2 {
			r.Path = r.Path[:maxAccessDatagram/2]
		}
		b, err := json.Marshal(r)
		if err != nil {
			a.dropped.Add(1)
			continue
		}
		if conn == nil {
			if conn, err = net.DialUnix("unixgram", nil, &net.UnixAddr{Name: a.path, Net: "unixgram"}); err != nil {
				conn = nil
				a.dropped.Add(1)
				continue
			}
		}
		if _, err := conn.Write(b); err != nil {
			conn.Close()
			conn = nil
			a.dropped.Add(1)
		}
	}
}

// AccessServer receives the proxy's access records on a unixgram
// socket and hands each to a function (in the agent).
type AccessServer struct {
	conn *net.UnixConn
	done chan struct{}
}

// NewAccessServer listens on path (replacing a stale socket) and calls
// fn with each record from one goroutine until Close; fn must not block.
func NewAccessServer(path string, fn func(AccessRecord), log *slog.Logger) (*AccessServer, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("access socket %s: %w", path, err)
	}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return nil, fmt.Errorf("access socket %s: %w", path, err)
	}
	// Only root (the proxy) may send records: they become events and
	// metrics.
	if err := os.Chmod(path, 0o600); err != nil {
		conn.Close()
		return nil, fmt.Errorf("access socket %s: %w", path, err)
	}
	s := &AccessServer{conn: conn, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		buf := make([]byte, maxAccessDatagram+1024)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return // closed
			}
			var r AccessRecord
			if err := json.Unmarshal(buf[:n], &r); err != nil {
				log.Warn("malformed access record from the L7 proxy", "err", err)
				continue
			}
			fn(r)
		}
	}()
	return s, nil
}

// Close stops the server and waits for its goroutine.
func (s *AccessServer) Close() {
	s.conn.Close()
	<-s.done
}
