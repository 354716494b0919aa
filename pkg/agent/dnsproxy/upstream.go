package dnsproxy

import (
	"context"
	"net"
	"net/netip"
	"sync"
)

// Bounds of the upstream sockets made ahead of use.
const (
	// upstreamDepth is how many sockets wait per server.
	upstreamDepth = 2
	// maxUpstreamServers bounds the servers with sockets waiting; a new
	// one beyond it closes all of them first.
	maxUpstreamServers = 64
)

// upstreams keeps UDP sockets connected to the servers pods asked
// lately, made ahead of use so that a query does not wait for a socket
// to be made and connected (about a fifth of the proxy's added delay on
// the benchmark's machine). Each socket serves one query, as a socket
// dialled for it would: a fresh ephemeral port per query. Sockets are
// made by run (Serve's goroutine) once a query that took one was
// answered (refill); a query that finds none dials its own. A datagram
// that reached a waiting socket before its query went out fails that
// query's ID check and is skipped (exchangeUDP), as it would be with a
// socket of its own.
type upstreams struct {
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// want asks run for sockets to a server (bounded; a full channel
	// drops the request: the next query asks again).
	want chan netip.AddrPort

	mu     sync.Mutex
	ready  map[netip.AddrPort][]net.Conn
	closed bool
}

func newUpstreams(dial func(ctx context.Context, network, addr string) (net.Conn, error)) *upstreams {
	return &upstreams{dial: dial, want: make(chan netip.AddrPort, maxUpstreamServers), ready: map[netip.AddrPort][]net.Conn{}}
}

// get returns a UDP socket connected to server, one made ahead when
// there is one; its replacement is asked for by refill.
func (u *upstreams) get(ctx context.Context, server netip.AddrPort) (net.Conn, error) {
	u.mu.Lock()
	var c net.Conn
	if cs := u.ready[server]; len(cs) > 0 {
		c = cs[len(cs)-1]
		u.ready[server] = cs[:len(cs)-1]
	}
	u.mu.Unlock()
	if c != nil {
		return c, nil
	}
	return u.dial(ctx, "udp", server.String())
}

// refill asks run to top server's sockets up. A query asks once it was
// answered: the sockets are made between queries, not while the query
// that took one waits for its answer (on a small machine the maker's
// dial competes with that query for a CPU).
func (u *upstreams) refill(server netip.AddrPort) {
	select {
	case u.want <- server:
	default:
	}
}

// run makes the sockets asked for until ctx ends, then closes the ones
// waiting.
func (u *upstreams) run(ctx context.Context) {
	defer u.close()
	for {
		select {
		case <-ctx.Done():
			return
		case server := <-u.want:
			u.fill(ctx, server)
		}
	}
}

// fill tops server's sockets up to upstreamDepth.
func (u *upstreams) fill(ctx context.Context, server netip.AddrPort) {
	for {
		u.mu.Lock()
		n, known := len(u.ready[server]), u.ready[server] != nil
		if u.closed || n >= upstreamDepth {
			u.mu.Unlock()
			return
		}
		if !known && len(u.ready) >= maxUpstreamServers {
			u.closeLocked()
		}
		u.mu.Unlock()
		c, err := u.dial(ctx, "udp", server.String())
		if err != nil {
			return // the query that finds none dials and reports it
		}
		u.mu.Lock()
		if u.closed {
			u.mu.Unlock()
			c.Close()
			return
		}
		u.ready[server] = append(u.ready[server], c)
		u.mu.Unlock()
	}
}

// waiting returns how many sockets wait for server.
func (u *upstreams) waiting(server netip.AddrPort) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.ready[server])
}

func (u *upstreams) close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.closed = true
	u.closeLocked()
}

func (u *upstreams) closeLocked() {
	for k, cs := range u.ready {
		for _, c := range cs {
			c.Close()
		}
		delete(u.ready, k)
	}
}
