package l7proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// ListenTransparentUDP is a proxy's UDP socket for redirected datagrams
// (a DNS proxy's): bound to ap (the loopback address and the proxy's
// port, where the BPF programs look the socket up) with IP_TRANSPARENT
// and IP_RECVORIGDSTADDR (IPV6_ too for an IPv6 ap), so that
// ReadOriginal returns each datagram's original destination.
func ListenTransparentUDP(ap netip.AddrPort) (*net.UDPConn, error) {
	lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
		return control(c, func(fd int) error {
			opts := [][3]int{{unix.SOL_IP, unix.IP_TRANSPARENT, 1}, {unix.SOL_IP, unix.IP_RECVORIGDSTADDR, 1}}
			if ap.Addr().Is6() {
				opts = append(opts, [3]int{unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1}, [3]int{unix.SOL_IPV6, unix.IPV6_RECVORIGDSTADDR, 1})
			}
			for _, o := range opts {
				if err := unix.SetsockoptInt(fd, o[0], o[1], o[2]); err != nil {
					return err
				}
			}
			return nil
		})
	}}
	pc, err := lc.ListenPacket(context.Background(), udpNetwork(ap), ap.String())
	if err != nil {
		return nil, fmt.Errorf("listen udp %s (transparent): %w", ap, err)
	}
	return pc.(*net.UDPConn), nil
}

// ReadOriginal reads one datagram into b: its length, sender and
// original destination (the address the client sent it to).
func ReadOriginal(conn *net.UDPConn, b []byte) (n int, from, orig netip.AddrPort, err error) {
	oob := make([]byte, 128)
	n, oobn, _, from, err := conn.ReadMsgUDPAddrPort(b, oob)
	if err != nil {
		return 0, from, orig, fmt.Errorf("read udp: %w", err)
	}
	if orig, err = OrigDst(oob[:oobn]); err != nil {
		return 0, from, orig, fmt.Errorf("read udp from %s: %w (not a redirected datagram?)", from, err)
	}
	return n, netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), orig, nil
}

// OrigDst returns the original destination in a datagram's control
// messages (IP_ORIGDSTADDR or IPV6_ORIGDSTADDR), IPv4 unmapped.
func OrigDst(oob []byte) (netip.AddrPort, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("control messages: %w", err)
	}
	var orig netip.AddrPort
	for _, m := range msgs {
		switch {
		case m.Header.Level == unix.SOL_IP && m.Header.Type == unix.IP_ORIGDSTADDR && len(m.Data) >= 8:
			orig = netip.AddrPortFrom(netip.AddrFrom4([4]byte(m.Data[4:8])), binary.BigEndian.Uint16(m.Data[2:4]))
		case m.Header.Level == unix.SOL_IPV6 && m.Header.Type == unix.IPV6_ORIGDSTADDR && len(m.Data) >= 24:
			orig = netip.AddrPortFrom(netip.AddrFrom16([16]byte(m.Data[8:24])), binary.BigEndian.Uint16(m.Data[2:4]))
		}
	}
	if !orig.IsValid() {
		return orig, errors.New("no original destination in the control messages")
	}
	return netip.AddrPortFrom(orig.Addr().Unmap(), orig.Port()), nil
}

// ReplyFrom sends b to the client to from the address it sent its
// datagram to (orig, which need not be local: IP_TRANSPARENT), so that
// the client's connected socket accepts it. Concurrent replies from one
// original address share it (SO_REUSEADDR).
func ReplyFrom(orig, to netip.AddrPort, b []byte) error {
	d := net.Dialer{LocalAddr: net.UDPAddrFromAddrPort(orig), Control: func(network, address string, c syscall.RawConn) error {
		return control(c, func(fd int) error {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
				return err
			}
			if orig.Addr().Is6() {
				return unix.SetsockoptInt(fd, unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1)
			}
			return unix.SetsockoptInt(fd, unix.SOL_IP, unix.IP_TRANSPARENT, 1)
		})
	}}
	c, err := d.Dial(udpNetwork(orig), to.String())
	if err != nil {
		return fmt.Errorf("reply from %s to %s: %w", orig, to, err)
	}
	defer c.Close()
	if _, err := c.Write(b); err != nil {
		return fmt.Errorf("reply from %s to %s: %w", orig, to, err)
	}
	return nil
}

func udpNetwork(ap netip.AddrPort) string {
	if ap.Addr().Is4() {
		return "udp4"
	}
	return "udp6"
}

// control runs fn on c's file descriptor.
func control(c syscall.RawConn, fn func(fd int) error) error {
	var ferr error
	if err := c.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}
