package etcdtest

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections from its own loopback address to a
// target. Cut closes every connection and refuses new ones until Restore,
// which makes the target unreachable for the clients that dial the proxy
// while others still reach it.
type Proxy struct {
	// Addr is the proxy's host:port.
	Addr   string
	target string
	l      net.Listener
	// mu guards cut and conns.
	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
}

// NewProxy starts a proxy to target (host:port); tb.Cleanup closes it.
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("proxy listen: %v", err)
	}
	p := &Proxy{Addr: l.Addr().String(), target: target, l: l, conns: map[net.Conn]struct{}{}}
	go p.serve()
	tb.Cleanup(func() {
		_ = l.Close()
		p.Cut()
	})
	return p
}

// Cut drops every connection and refuses new ones.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
}

// Restore accepts connections again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

func (p *Proxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		go p.forward(c)
	}
}

// track registers c unless the proxy is cut.
func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *Proxy) forward(c net.Conn) {
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	if !p.track(c, u) {
		_ = c.Close()
		_ = u.Close()
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		_ = dst.Close()
		_ = src.Close()
		done <- struct{}{}
	}
	go pipe(u, c)
	go pipe(c, u)
	<-done
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, u)
	p.mu.Unlock()
}
