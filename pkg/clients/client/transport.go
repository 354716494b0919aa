package client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"
)

// connTransport is the http.RoundTripper of the unix-socket client: HTTP/1.1
// on pooled connections, each request written and its answer read by the
// calling goroutine. http.Transport runs a reader and a writer goroutine
// per connection and hands every request and answer between three
// goroutines; on a local socket with small answers those hand-offs cost
// more than the request (the simulator's 64 clients spent a tenth of the
// process's CPU in them).
//
// A connection goes back to the pool once its answer's body has been read
// to the end (or had none); a body closed early, an error or a
// "Connection: close" closes it. A request whose connection turns out to
// be dead before anything was written, or a replayable request (GET,
// HEAD, OPTIONS) that got no answer on a reused connection, is sent once
// more on a new one, as http.Transport does.
type connTransport struct {
	dial        func(ctx context.Context) (net.Conn, error)
	maxIdle     int
	idleTimeout time.Duration

	mu     sync.Mutex
	idle   []*pconn // most recently used last
	closed bool
}

// pconn is one connection with its buffers.
type pconn struct {
	conn   net.Conn
	br     *bufio.Reader
	bw     *bufio.Writer
	idleAt time.Time // when it went back to the pool
	reused bool
}

// errNothingWritten marks a failure before any byte of the request left.
var errNothingWritten = errors.New("connection failed before the request was written")

// aLongTimeAgo is a deadline in the past: it interrupts a blocked call.
var aLongTimeAgo = time.Unix(1, 0)

func newConnTransport(dial func(ctx context.Context) (net.Conn, error)) *connTransport {
	return &connTransport{dial: dial, maxIdle: 256, idleTimeout: 30 * time.Second}
}

// RoundTrip implements http.RoundTripper.
func (t *connTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		pc, err := t.get(req.Context())
		if err != nil {
			closeBody(req)
			return nil, err
		}
		resp, err := t.send(pc, req)
		if err == nil {
			return resp, nil
		}
		if attempt > 0 || !pc.reused || !retryable(req, err) {
			closeBody(req)
			return nil, err
		}
		if req, err = rewind(req); err != nil {
			return nil, err
		}
	}
}

// retryable reports whether a request that failed on a reused connection
// may be sent again: nothing was written, or it is replayable and no
// answer came.
func retryable(req *http.Request, err error) bool {
	if req.Context().Err() != nil {
		return false
	}
	if errors.Is(err, errNothingWritten) {
		return true
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions:
		return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
			errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
	}
	return false
}

// rewind returns req with a fresh body for a second attempt.
func rewind(req *http.Request) (*http.Request, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return req, nil
	}
	if req.GetBody == nil {
		return nil, fmt.Errorf("retry %s %s: body cannot be sent again", req.Method, req.URL.Path)
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, fmt.Errorf("retry %s %s: %w", req.Method, req.URL.Path, err)
	}
	r := *req
	r.Body = body
	return &r, nil
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// get takes the most recently used idle connection, or dials one.
func (t *connTransport) get(ctx context.Context) (*pconn, error) {
	now := time.Now()
	t.mu.Lock()
	for n := len(t.idle); n > 0; n = len(t.idle) {
		pc := t.idle[n-1]
		t.idle[n-1] = nil
		t.idle = t.idle[:n-1]
		if now.Sub(pc.idleAt) < t.idleTimeout {
			t.mu.Unlock()
			pc.reused = true
			return pc, nil
		}
		_ = pc.conn.Close()
	}
	t.mu.Unlock()
	conn, err := t.dial(ctx)
	if err != nil {
		return nil, err
	}
	return &pconn{conn: conn, br: bufio.NewReader(conn), bw: bufio.NewWriter(conn)}, nil
}

// put returns a connection whose last answer was read completely.
func (t *connTransport) put(pc *pconn) {
	pc.idleAt = time.Now()
	t.mu.Lock()
	if !t.closed && len(t.idle) < t.maxIdle {
		t.idle = append(t.idle, pc)
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	_ = pc.conn.Close()
}

// CloseIdleConnections closes the pooled connections (http.Client calls
// it); connections in use close when their answer is done.
func (t *connTransport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = nil
	t.mu.Unlock()
	for _, pc := range idle {
		_ = pc.conn.Close()
	}
}

// send writes req on pc and reads the answer's head. The context's
// deadline bounds both and its cancellation interrupts them; the body is
// read by the caller (see eofBody). On error pc is closed; a deadline or
// a cancellation is reported as the context's error, as http.Transport
// does.
func (t *connTransport) send(pc *pconn, req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	deadline, _ := ctx.Deadline() // zero: none
	if err := pc.conn.SetDeadline(deadline); err != nil {
		_ = pc.conn.Close()
		return nil, fmt.Errorf("%w: %w", errNothingWritten, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = pc.conn.SetDeadline(aLongTimeAgo) })
	fail := func(err error) (*http.Response, error) {
		stop()
		_ = pc.conn.Close()
		switch cerr := ctx.Err(); {
		case cerr != nil:
			err = fmt.Errorf("%w (%w)", cerr, err)
		case !deadline.IsZero() && errors.Is(err, os.ErrDeadlineExceeded):
			err = fmt.Errorf("%w (%w)", context.DeadlineExceeded, err)
		}
		return nil, err
	}
	if err := req.Write(pc.bw); err != nil {
		return fail(fmt.Errorf("write request: %w", err))
	}
	if err := pc.bw.Flush(); err != nil {
		// Nothing reached a peer that is gone: a unix socket refuses the
		// first byte (EPIPE) rather than buffering it.
		return fail(fmt.Errorf("%w: %w", errNothingWritten, err))
	}
	resp, err := http.ReadResponse(pc.br, req)
	if err != nil {
		return fail(fmt.Errorf("read answer: %w", err))
	}
	keep := !resp.Close && !req.Close
	if resp.Body == http.NoBody || resp.ContentLength == 0 {
		stop()
		t.release(pc, keep)
		return resp, nil
	}
	resp.Body = &eofBody{t: t, pc: pc, body: resp.Body, stop: stop, keep: keep}
	return resp, nil
}

// release pools pc, or closes it when it cannot carry another request.
func (t *connTransport) release(pc *pconn, keep bool) {
	if keep && pc.br.Buffered() == 0 {
		t.put(pc)
		return
	}
	_ = pc.conn.Close()
}

// eofBody hands the connection back once the body was read to its end.
type eofBody struct {
	t    *connTransport
	pc   *pconn
	body io.ReadCloser
	stop func() bool
	keep bool
	done bool
}

func (b *eofBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.body.Read(p)
	if err == io.EOF {
		b.finish(true)
	} else if err != nil {
		b.finish(false)
	}
	return n, err
}

func (b *eofBody) Close() error {
	b.finish(false)
	return nil
}

// finish ends the answer: at its end (eof) the connection may be reused,
// otherwise it is closed.
func (b *eofBody) finish(eof bool) {
	if b.done {
		return
	}
	b.done = true
	b.stop()
	_ = b.body.Close()
	if eof {
		b.t.release(b.pc, b.keep)
		return
	}
	_ = b.pc.conn.Close()
}
