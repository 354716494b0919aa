package api

import (
	"fmt"
	"net"
	"sync"
	"time"
)

// CodeTooManyConnections is the code of the answer a listener gives to a
// connection beyond its cap (503), before closing it.
const CodeTooManyConnections = "too-many-connections"

// refuseWriteTimeout bounds writing the refusal to a connection beyond
// the cap (a fresh socket's send buffer takes it at once).
const refuseWriteTimeout = time.Second

// LimitListener returns l serving at most max connections at once (max
// <= 0: no cap). A connection accepted beyond the cap is answered 503
// too-many-connections and closed at once, so that a flood of idle
// connections costs the agent no more than max file descriptors and a
// client over the cap learns why at once. A slot is freed when the
// server closes the connection (idle timeout, client gone, error).
func LimitListener(l net.Listener, max int) net.Listener {
	if max <= 0 {
		return l
	}
	return &limitListener{Listener: l, slots: make(chan struct{}, max), refusal: refusal(max)}
}

type limitListener struct {
	net.Listener
	slots   chan struct{} // one element per open connection
	refusal []byte
}

// refusal is the HTTP answer of a connection beyond a cap of max.
func refusal(max int) []byte {
	body := fmt.Sprintf(`{"code":%q,"message":"the listener serves at most %d connections at once; retry later"}`+"\n", CodeTooManyConnections, max)
	return fmt.Appendf(nil, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\nRetry-After: 1\r\n\r\n%s", len(body), body)
}

// Accept returns the next connection within the cap, refusing those
// beyond it.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &limitConn{Conn: c, slots: l.slots}, nil
		default:
			_ = c.SetWriteDeadline(time.Now().Add(refuseWriteTimeout))
			_, _ = c.Write(l.refusal)
			_ = c.Close()
		}
	}
}

// limitConn frees its slot on the first Close.
type limitConn struct {
	net.Conn
	slots chan struct{}
	once  sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { <-c.slots })
	return err
}

// CloseWrite passes half-closes through (http.Server uses them to let a
// client read an error answer before the connection closes).
func (c *limitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
