package proxy

import (
	"context"
	"encoding/json"
	"net"
	"sync/atomic"

	"github.com/membrane-cni/membrane/datapath/l7proxy/xdsapi"
)

// accessQueue bounds the records waiting for the writer: a request
// never waits for the agent; a full queue drops the record (counted).
const accessQueue = 4096

// accessLog sends access records to the agent from one goroutine.
type accessLog struct {
	path    string
	ch      chan xdsapi.AccessRecord
	dropped atomic.Uint64
}

func newAccessLog(path string) *accessLog {
	return &accessLog{path: path, ch: make(chan xdsapi.AccessRecord, accessQueue)}
}

// log queues r without blocking.
func (a *accessLog) log(r xdsapi.AccessRecord) {
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
		var r xdsapi.AccessRecord
		select {
		case <-ctx.Done():
			return
		case r = <-a.ch:
		}
		if len(r.Path) > xdsapi.MaxAccessDatagram/2 {
			r.Path = r.Path[:xdsapi.MaxAccessDatagram/2]
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
