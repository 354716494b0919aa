package datapath

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/datapath/l7proxy"
)

var (
	_ TransparentSockets = (*Linux)(nil)
	_ TransparentSockets = NetnsSockets{}
)

// ListenTransparent implements TransparentSockets.
func (l *Linux) ListenTransparent(port uint16) (*ProxySockets, error) {
	return NetnsSockets{Path: l.cfg.HostNetns}.ListenTransparent(port)
}

// BindTransparentUDP implements TransparentSockets.
func (l *Linux) BindTransparentUDP(local netip.AddrPort) (*net.UDPConn, error) {
	return NetnsSockets{Path: l.cfg.HostNetns}.BindTransparentUDP(local)
}

// NetnsSockets opens TransparentSockets in the network namespace at Path
// ("" : the caller's).
type NetnsSockets struct{ Path string }

func (n NetnsSockets) in(fn func() error) error {
	if n.Path == "" {
		return fn()
	}
	return inNetns(n.Path, fn)
}

// DialHost implements TransparentSockets.
func (n NetnsSockets) DialHost(ctx context.Context, network, addr string) (net.Conn, error) {
	var (
		d    net.Dialer
		conn net.Conn
	)
	err := n.in(func() (err error) {
		conn, err = d.DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

// ListenTransparent implements TransparentSockets.
func (n NetnsSockets) ListenTransparent(port uint16) (*ProxySockets, error) {
	socks := &ProxySockets{}
	err := n.in(func() error {
		for _, lo := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()} {
			udp, tcp, err := listenTransparent(netip.AddrPortFrom(lo, port))
			if lo.Is6() && noIPv6(err) {
				return nil // no IPv6 here: no IPv6 client can be redirected either
			}
			if err != nil {
				return err
			}
			socks.UDP, socks.TCP = append(socks.UDP, udp), append(socks.TCP, tcp)
		}
		return nil
	})
	if err != nil {
		socks.Close()
		return nil, fmt.Errorf("dns proxy sockets: %w", err)
	}
	return socks, nil
}

// noIPv6 reports whether err says the netns has no IPv6 loopback address
// (IPv6 disabled, or off on lo).
func noIPv6(err error) bool {
	return errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.EAFNOSUPPORT)
}

// listenTransparent opens the UDP and TCP sockets of one family at ap.
func listenTransparent(ap netip.AddrPort) (*net.UDPConn, *net.TCPListener, error) {
	v6 := ap.Addr().Is6()
	lc := net.ListenConfig{Control: transparentControl(v6, true)}
	pc, err := lc.ListenPacket(context.Background(), network("udp", v6), ap.String())
	if err != nil {
		return nil, nil, fmt.Errorf("listen udp %s: %w", ap, err)
	}
	lc.Control = transparentControl(v6, false)
	ln, err := lc.Listen(context.Background(), network("tcp", v6), ap.String())
	if err != nil {
		pc.Close()
		return nil, nil, fmt.Errorf("listen tcp %s: %w", ap, err)
	}
	return pc.(*net.UDPConn), ln.(*net.TCPListener), nil
}

// network is proto ("udp", "tcp") of one family.
func network(proto string, v6 bool) string {
	if v6 {
		return proto + "6"
	}
	return proto + "4"
}

// BindTransparentUDP implements TransparentSockets.
func (n NetnsSockets) BindTransparentUDP(local netip.AddrPort) (*net.UDPConn, error) {
	var conn *net.UDPConn
	local = netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
	err := n.in(func() error {
		v6 := local.Addr().Is6()
		lc := net.ListenConfig{Control: transparentControl(v6, false)}
		pc, err := lc.ListenPacket(context.Background(), network("udp", v6), local.String())
		if err != nil {
			return err
		}
		conn = pc.(*net.UDPConn)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("bind transparent udp %s: %w", local, err)
	}
	return conn, nil
}

// transparentControl sets IP_TRANSPARENT (IPV6_TRANSPARENT for v6) and
// SO_REUSEADDR (several reply sockets may share a server's address)
// and, with origDst, IP_RECVORIGDSTADDR (IPV6_RECVORIGDSTADDR).
func transparentControl(v6, origDst bool) func(string, string, syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			opts := [][2]int{{unix.SOL_IP, unix.IP_TRANSPARENT}, {unix.SOL_SOCKET, unix.SO_REUSEADDR}}
			if v6 {
				opts[0] = [2]int{unix.SOL_IPV6, unix.IPV6_TRANSPARENT}
			}
			if origDst && v6 {
				opts = append(opts, [2]int{unix.SOL_IPV6, unix.IPV6_RECVORIGDSTADDR})
			} else if origDst {
				opts = append(opts, [2]int{unix.SOL_IP, unix.IP_RECVORIGDSTADDR})
			}
			for _, o := range opts {
				if serr = unix.SetsockoptInt(int(fd), o[0], o[1], 1); serr != nil {
					serr = fmt.Errorf("setsockopt %d/%d: %w", o[0], o[1], serr)
					return
				}
			}
		})
		return errors.Join(err, serr)
	}
}

// OrigDst returns the original destination in a UDP datagram's control
// messages (IP_RECVORIGDSTADDR): l7proxy.OrigDst, shared with the L7
// proxy's UDP path.
func OrigDst(oob []byte) (netip.AddrPort, error) { return l7proxy.OrigDst(oob) }

// OrigDstOOBSize is the control buffer size OrigDst needs (either
// family).
var OrigDstOOBSize = unix.CmsgSpace(unix.SizeofSockaddrInet6)
