package datapath

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// hostUDPBatch is how many UDP sockets one trip to the host netns's
// thread makes ahead of use.
const hostUDPBatch = 16

// hostUDP keeps UDP sockets made in a host netns other than the agent's
// (LinuxConfig.HostNetns), unbound and unconnected, so that a UDP dial
// (the DNS proxy's upstream query, one socket per query) does not wait
// for that netns's thread each time: a miss makes hostUDPBatch at once.
// Each socket is used once; its port is chosen at connect as for any
// dial. Close closes the ones left.
type hostUDP struct {
	mu     sync.Mutex
	fds    [2][]int // by family: 0 IPv4, 1 IPv6
	closed bool
	trips  int // batches made (tests)
}

// dial connects a pooled socket of ap's family to ap and returns it as a
// net.Conn; inHost runs a function on the host netns's thread.
func (h *hostUDP) dial(ap netip.AddrPort, inHost func(func() error) error) (net.Conn, error) {
	fam, domain := 0, unix.AF_INET
	if ap.Addr().Is6() {
		fam, domain = 1, unix.AF_INET6
	}
	fd, err := h.take(fam, domain, inHost)
	if err != nil {
		return nil, err
	}
	var sa unix.Sockaddr
	if fam == 0 {
		sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	} else {
		sa = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	}
	if err := unix.Connect(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("dial udp %s: %w", ap, err)
	}
	f := os.NewFile(uintptr(fd), "udp "+ap.String())
	defer f.Close() // FileConn holds its own copy
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("dial udp %s: %w", ap, err)
	}
	return c, nil
}

// take returns a socket of the family, making a batch in the host netns
// when none is left.
func (h *hostUDP) take(fam, domain int, inHost func(func() error) error) (int, error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return -1, net.ErrClosed
	}
	if n := len(h.fds[fam]); n > 0 {
		fd := h.fds[fam][n-1]
		h.fds[fam] = h.fds[fam][:n-1]
		h.mu.Unlock()
		return fd, nil
	}
	h.mu.Unlock()
	var batch []int
	err := inHost(func() error {
		for range hostUDPBatch {
			fd, err := unix.Socket(domain, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
			if err != nil {
				if len(batch) > 0 {
					return nil
				}
				return fmt.Errorf("udp socket in the host netns: %w", err)
			}
			batch = append(batch, fd)
		}
		return nil
	})
	if err != nil {
		for _, fd := range batch {
			unix.Close(fd)
		}
		return -1, err
	}
	fd := batch[0]
	h.mu.Lock()
	defer h.mu.Unlock()
	h.trips++
	if h.closed {
		for _, fd := range batch {
			unix.Close(fd)
		}
		return -1, net.ErrClosed
	}
	h.fds[fam] = append(h.fds[fam], batch[1:]...)
	return fd, nil
}

// close closes the pooled sockets; later dials fail.
func (h *hostUDP) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for fam := range h.fds {
		for _, fd := range h.fds[fam] {
			unix.Close(fd)
		}
		h.fds[fam] = nil
	}
}
