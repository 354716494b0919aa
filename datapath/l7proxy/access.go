package l7proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"

	"github.com/membrane-cni/membrane/datapath/l7proxy/xdsapi"
)

// AccessRecord is the proxy's record of one request (xdsapi).
type AccessRecord = xdsapi.AccessRecord

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
		buf := make([]byte, xdsapi.MaxAccessDatagram+1024)
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
