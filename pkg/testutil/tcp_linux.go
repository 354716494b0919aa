package testutil

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"
)

// EchoServer serves a TCP echo on addr:port inside ns until tb ends.
func EchoServer(tb testing.TB, ns *NS, addr netip.Addr, port int) {
	tb.Helper()
	var ln net.Listener
	if err := ns.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(addr.String(), strconv.Itoa(port)))
		return err
	}); err != nil {
		tb.Fatalf("echo server on %s:%d: %v", addr, port, err)
	}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
}

// Exchange connects from inside ns to addr:port within timeout (a bound
// for a connection that policy drops, not a timing assertion) and sends
// a message that must come back: the request and the reply both pass.
func Exchange(ns *NS, addr netip.Addr, port int, timeout time.Duration) error {
	return ns.Do(func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(addr.String(), strconv.Itoa(port)), timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		msg := []byte("membrane")
		if _, err := c.Write(msg); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, make([]byte, len(msg))); err != nil {
			return fmt.Errorf("read reply: %w", err)
		}
		return nil
	})
}
