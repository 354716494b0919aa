package datapath

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestDialHostUDP: a UDP dial of a datapath whose host netns is not the
// agent's gets a socket of that netns (it reaches a server listening only
// there), one trip to the netns's thread per hostUDPBatch dials, and
// none after Close (the sockets kept are closed).
func TestDialHostUDP(t *testing.T) {
	l, host, nl := newTestLinux(t, LinuxConfig{})
	lo, err := nl.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	var srv *net.UDPConn
	if err := host.Do(func() (err error) {
		srv, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	go func() {
		buf := make([]byte, 64)
		for {
			n, from, err := srv.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = srv.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	addr := netip.MustParseAddrPort(srv.LocalAddr().String()).String()
	const dials = 2*hostUDPBatch + 1
	ports := map[string]bool{}
	for i := range dials {
		c, err := l.DialHost(context.Background(), "udp", addr)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatalf("dial %d: write: %v", i, err)
		}
		buf := make([]byte, 8)
		if n, err := c.Read(buf); err != nil || string(buf[:n]) != "ping" {
			t.Fatalf("dial %d: the host netns's server did not answer: %q, %v", i, buf[:n], err)
		}
		ports[c.LocalAddr().String()] = true
		c.Close()
	}
	l.hostUDP.mu.Lock()
	trips, kept := l.hostUDP.trips, len(l.hostUDP.fds[0])
	l.hostUDP.mu.Unlock()
	if want := (dials + hostUDPBatch - 1) / hostUDPBatch; trips != want {
		t.Fatalf("%d dials made %d trips to the host netns, want %d", dials, trips, want)
	}
	if kept != trips*hostUDPBatch-dials {
		t.Fatalf("%d sockets kept after %d dials in %d trips", kept, dials, trips)
	}
	if len(ports) < dials/2 {
		t.Fatalf("%d dials used only %d local ports", dials, len(ports))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.DialHost(context.Background(), "udp", addr); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("dial after Close: %v", err)
	}
	l.hostUDP.mu.Lock()
	defer l.hostUDP.mu.Unlock()
	if n := len(l.hostUDP.fds[0]); n != 0 {
		t.Fatalf("%d sockets left open after Close", n)
	}
}
