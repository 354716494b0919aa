package testutil

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// DelayProxy is a TCP proxy that delivers every byte it relays a set
// delay after it read it, in both directions, order kept: a slow control
// plane (an API server or etcd seconds away) for fault tests. Each
// direction of a connection holds at most 64 chunks of 32 KiB in flight;
// beyond that the reader waits (TCP back-pressure, as a slow link gives).
type DelayProxy struct {
	ln     net.Listener
	target string
	delay  atomic.Int64
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
	// Accepted counts the connections accepted since the start.
	Accepted atomic.Int64
}

// NewDelayProxy listens on 127.0.0.1 and relays each connection to
// target (host:port).
func NewDelayProxy(target string) (*DelayProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &DelayProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *DelayProxy) Addr() string { return p.ln.Addr().String() }

// SetDelay sets the one-way delay of the bytes read from now on.
func (p *DelayProxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// Open is how many connections (both halves counted once) are open.
func (p *DelayProxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns) / 2
}

// CutAll closes every open connection (clients see a reset and must
// reconnect, e.g. informers relist).
func (p *DelayProxy) CutAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Close stops listening, cuts every connection and waits for the relay
// goroutines.
func (p *DelayProxy) Close() {
	p.ln.Close()
	p.CutAll()
	p.wg.Wait()
}

func (p *DelayProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.Accepted.Add(1)
		up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.track(c, up)
		p.wg.Add(2)
		go p.relay(c, up)
		go p.relay(up, c)
	}
}

// track records both halves.
func (p *DelayProxy) track(a, b net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns[a], p.conns[b] = struct{}{}, struct{}{}
}

func (p *DelayProxy) untrack(a, b net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, a)
	delete(p.conns, b)
}

type chunk struct {
	data []byte
	at   time.Time
}

// relay copies src to dst, each chunk delayed by the delay in force
// when it was read.
func (p *DelayProxy) relay(src, dst net.Conn) {
	defer p.wg.Done()
	q := make(chan chunk, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ch := range q {
			if d := time.Until(ch.at); d > 0 {
				time.Sleep(d)
			}
			if _, err := dst.Write(ch.data); err != nil {
				break
			}
		}
		for range q { // drain after a write error
		}
	}()
	for {
		buf := make([]byte, 32<<10)
		n, err := src.Read(buf)
		if n > 0 {
			q <- chunk{data: buf[:n], at: time.Now().Add(time.Duration(p.delay.Load()))}
		}
		if err != nil { // EOF, reset or CutAll
			break
		}
	}
	close(q)
	<-done
	src.Close()
	dst.Close()
	p.untrack(src, dst)
}
