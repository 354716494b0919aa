package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// A pinned upstream is one upstream connection per client (downstream)
// HTTP/1.x connection, written and read by the goroutine serving the
// client's request: a request and its answer cross no other goroutine
// (http.Transport hands each one to a connection's write and read loops,
// two wake-ups per request that cost more CPU here than the proxy's own
// work). Requests it does not take go through the identity's transport
// as before: HTTP/2, a request with a body, an upgrade, Expect:
// 100-continue.

// responseHeaderTimeout bounds the wait for an upstream's response
// header (as the transports' ResponseHeaderTimeout).
const responseHeaderTimeout = time.Minute

// pinnedKey is the context key of a client connection's *pinned.
type pinnedKey struct{}

// pinned is a client connection's upstream connection (conn nil: none
// yet, or closed).
type pinned struct {
	mu     sync.Mutex // guards the fields below; held for one exchange
	closed bool       // the client connection is gone
	key    upstreamKey
	dst    netip.AddrPort
	conn   net.Conn
	br     *bufio.Reader
	bw     *bufio.Writer
}

// pinnedConns follows the client connections' pinned upstreams, to close
// them with their client connection (http.Server.ConnState).
type pinnedConns struct{ m sync.Map } // net.Conn -> *pinned

// connContext gives a new client connection its pinned upstream slot
// (http.Server.ConnContext).
func (pc *pinnedConns) connContext(ctx context.Context, c net.Conn) context.Context {
	p := &pinned{}
	pc.m.Store(c, p)
	return context.WithValue(ctx, pinnedKey{}, p)
}

// connState closes a client connection's upstream once the client
// connection is closed or hijacked (http.Server.ConnState).
func (pc *pinnedConns) connState(c net.Conn, st http.ConnState) {
	if st != http.StateClosed && st != http.StateHijacked {
		return
	}
	v, ok := pc.m.LoadAndDelete(c)
	if !ok {
		return
	}
	p := v.(*pinned)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.dropLocked()
}

func (p *pinned) dropLocked() {
	if p.conn != nil {
		p.conn.Close()
		p.conn, p.br, p.bw = nil, nil, nil
	}
}

// pinnable reports whether r can go over a pinned upstream: HTTP/1.x,
// no body, no upgrade, no 100-continue.
func pinnable(r *http.Request) bool {
	return r.ProtoMajor == 1 && (r.Body == nil || r.Body == http.NoBody) && r.ContentLength == 0 &&
		len(r.TransferEncoding) == 0 && r.Header.Get("Upgrade") == "" && r.Header.Get("Expect") == ""
}

// pinnedTransport sends one request over its client connection's pinned
// upstream to dst with the identity and source of key, or through
// fallback when the request is not pinnable.
type pinnedTransport struct {
	p        *pinned
	key      upstreamKey
	dst      netip.AddrPort
	fallback http.RoundTripper
}

// errPinnedClosed: the client connection closed while its request was
// being proxied.
var errPinnedClosed = errors.New("client connection closed")

// RoundTrip implements http.RoundTripper. The response body must be
// read to its end or closed before the next request of the client
// connection (the reverse proxy does both before it answers).
func (t *pinnedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if !pinnable(r) {
		return t.fallback.RoundTrip(r)
	}
	p := t.p
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errPinnedClosed
	}
	if p.conn != nil && (p.key != t.key || p.dst != t.dst) {
		p.dropLocked()
	}
	reused := p.conn != nil
	resp, err := t.exchangeLocked(r)
	if err != nil && reused && replayable(r) {
		// The server may have closed the idle connection: once more on
		// a new one, as http.Transport retries.
		resp, err = t.exchangeLocked(r)
	}
	if err != nil {
		p.dropLocked()
		p.mu.Unlock()
		return nil, err
	}
	// p.mu stays held until the body is done: the client connection's
	// next request waits for this one's answer.
	resp.Body = &pinnedBody{rc: resp.Body, p: p, reuse: !resp.Close && !r.Close}
	return resp, nil
}

// replayable: a request without a body whose method is idempotent can
// be sent again after a failure on a reused connection.
func replayable(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, k := r.Header["Idempotency-Key"]
	_, xk := r.Header["X-Idempotency-Key"]
	return k || xk
}

// exchangeLocked writes r on the pinned connection (dialled when there
// is none) and reads the response header, skipping informational
// answers. On an error the connection is dropped.
func (t *pinnedTransport) exchangeLocked(r *http.Request) (*http.Response, error) {
	p := t.p
	if p.conn == nil {
		d := upstreamDialer(t.key.id, t.key.src)
		c, err := d.DialContext(r.Context(), "tcp", t.dst.String())
		if err != nil {
			return nil, err
		}
		p.conn, p.key, p.dst = c, t.key, t.dst
		p.br, p.bw = bufio.NewReaderSize(c, 4096), bufio.NewWriterSize(c, 4096)
	}
	if err := p.conn.SetDeadline(time.Now().Add(responseHeaderTimeout)); err != nil {
		p.dropLocked()
		return nil, err
	}
	if err := r.Write(p.bw); err != nil {
		p.dropLocked()
		return nil, err
	}
	if err := p.bw.Flush(); err != nil {
		p.dropLocked()
		return nil, err
	}
	for {
		resp, err := http.ReadResponse(p.br, r)
		if err != nil {
			p.dropLocked()
			return nil, err
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			if resp.StatusCode == http.StatusSwitchingProtocols {
				// Upgrades are never pinned: a 101 here is the
				// server's error.
				resp.Body.Close()
				p.dropLocked()
				return nil, errors.New("upstream switched protocols without an upgrade request")
			}
			// The body's reads have no deadline: a long download is
			// bounded by the client, as through the transports.
			if err := p.conn.SetDeadline(time.Time{}); err != nil {
				p.dropLocked()
				return nil, err
			}
			return resp, nil
		}
		// 1xx (100, 102, 103): informational, dropped.
		resp.Body.Close()
	}
}

// pinnedBody is a pinned response's body: at its end the connection is
// kept for the client connection's next request (or dropped when either
// side asked to close it, or the body was not read to its end), and the
// pinned slot is released.
type pinnedBody struct {
	rc    io.ReadCloser
	p     *pinned
	reuse bool
	eof   bool
	done  bool
}

func (b *pinnedBody) Read(buf []byte) (int, error) {
	if b.done {
		return 0, errors.New("read after close")
	}
	n, err := b.rc.Read(buf)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *pinnedBody) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	if !b.eof && b.rc != http.NoBody {
		// Not read to its end: the connection goes first, so that
		// closing the body does not drain the rest from the server.
		b.reuse = false
		b.p.dropLocked()
	}
	err := b.rc.Close()
	if !b.reuse || b.p.closed {
		b.p.dropLocked()
	}
	b.p.mu.Unlock()
	return err
}
