package datapath

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/datapath/l7proxy"
)

var (
	_ TransparentSockets = (*Linux)(nil)
	_ TransparentSockets = NetnsSockets{}
)

// ListenTransparent implements TransparentSockets.
func (l *Linux) ListenTransparent(port uint16) (*net.UDPConn, *net.TCPListener, error) {
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
func (n NetnsSockets) ListenTransparent(port uint16) (udp *net.UDPConn, tcp *net.TCPListener, err error) {
	// The BPF programs assign to the socket found at 127.0.0.1:port.
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))
	err = n.in(func() error {
		lc := net.ListenConfig{Control: transparentControl(true)}
		pc, err := lc.ListenPacket(context.Background(), "udp4", addr)
		if err != nil {
			return fmt.Errorf("listen udp %s: %w", addr, err)
		}
		lc.Control = transparentControl(false)
		ln, err := lc.Listen(context.Background(), "tcp4", addr)
		if err != nil {
			pc.Close()
			return fmt.Errorf("listen tcp %s: %w", addr, err)
		}
		udp, tcp = pc.(*net.UDPConn), ln.(*net.TCPListener)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("dns proxy sockets: %w", err)
	}
	return udp, tcp, nil
}

// BindTransparentUDP implements TransparentSockets.
func (n NetnsSockets) BindTransparentUDP(local netip.AddrPort) (*net.UDPConn, error) {
	var conn *net.UDPConn
	err := n.in(func() error {
		lc := net.ListenConfig{Control: transparentControl(false)}
		pc, err := lc.ListenPacket(context.Background(), "udp4", local.String())
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

// transparentControl sets IP_TRANSPARENT and SO_REUSEADDR (several reply
// sockets may share a server's address) and, with origDst,
// IP_RECVORIGDSTADDR.
func transparentControl(origDst bool) func(string, string, syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			opts := [][2]int{{unix.SOL_IP, unix.IP_TRANSPARENT}, {unix.SOL_SOCKET, unix.SO_REUSEADDR}}
			if origDst {
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

// OrigDstOOBSize is the control buffer size OrigDst needs.
var OrigDstOOBSize = unix.CmsgSpace(unix.SizeofSockaddrInet4)
