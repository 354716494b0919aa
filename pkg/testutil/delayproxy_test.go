package testutil

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// TestDelayProxy: an echo server behind the proxy answers a line only
// after twice the delay (once each way), in order, and CutAll resets
// the connection.
func TestDelayProxy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 1024)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	p, err := NewDelayProxy(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const delay = 150 * time.Millisecond
	p.SetDelay(delay)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	t0 := time.Now()
	for _, line := range []string{"one\n", "two\n"} {
		if _, err := c.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"one\n", "two\n"} {
		got, err := r.ReadString('\n')
		if err != nil || got != want {
			t.Fatalf("read %q, %v; want %q", got, err, want)
		}
	}
	if took := time.Since(t0); took < 2*delay {
		t.Fatalf("echo through the proxy took %s, want at least %s (the delay each way)", took, 2*delay)
	}
	if p.Open() != 1 {
		t.Fatalf("Open = %d, want 1", p.Open())
	}
	p.CutAll()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("read after CutAll succeeded")
	}
}
