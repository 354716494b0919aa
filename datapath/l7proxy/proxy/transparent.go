package proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// Marks of the proxy's upstream connections (bpf/endpoint.h): the low
// byte says "from the proxy", the upper 24 bits carry the client's
// identity, which the destination endpoint's program takes as the peer
// (and never redirects the connection to the proxy again).
const (
	markProxyMagic  = 0x4e
	markIdentityMax = 0xffffff
)

// maxUpstreams bounds the per-identity upstream transports (each keeps
// its own idle connections); beyond it, an identity's requests use a
// transport of their own without kept-alive connections.
const maxUpstreams = 4096

// transparentListen listens on ap with IP_TRANSPARENT (and
// IPV6_TRANSPARENT): the BPF programs assign connections for any
// destination to this socket (bpf_sk_assign), and the accepted sockets
// answer from that destination's address.
func transparentListen(ap netip.AddrPort) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if ap.Addr().Is6() {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1)
				if serr != nil {
					return
				}
			}
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	network := "tcp4"
	if ap.Addr().Is6() {
		network = "tcp"
	}
	lis, err := lc.Listen(context.Background(), network, ap.String())
	if err != nil {
		return nil, fmt.Errorf("proxy listen %s (transparent): %w", ap, err)
	}
	return lis, nil
}

// upstreams holds one HTTP transport per client identity: the dialer of
// each marks its connections with that identity, and connection reuse
// never crosses identities.
type upstreams struct {
	mu sync.Mutex
	// byID guards nothing else; bounded by maxUpstreams.
	byID map[upstreamKey]*http.Transport
}

// upstreamKey names one upstream transport: the client identity its
// connections are marked with, whether they speak HTTP/2 (h2c, prior
// knowledge: a request that reached the proxy over HTTP/2 goes on over
// HTTP/2, so gRPC's streams and trailers pass unchanged; HTTP/1.x stays
// HTTP/1.x) and the source address they are bound to (invalid: the
// node's, chosen by routing).
type upstreamKey struct {
	id  identity.NumericIdentity
	h2  bool
	src netip.Addr
}

func newUpstreams() *upstreams {
	return &upstreams{byID: map[upstreamKey]*http.Transport{}}
}

// markOf is the SO_MARK of an upstream connection for id: an identity
// too large for the mark is left out (the destination then sees the
// node's address).
func markOf(id identity.NumericIdentity) int {
	if uint64(id) > markIdentityMax {
		return markProxyMagic
	}
	return int(id)<<8 | markProxyMagic
}

func newTransport(k upstreamKey, keepAlive bool) *http.Transport {
	d := upstreamDialer(k.id, k.src)
	t := &http.Transport{DialContext: d.DialContext, DisableKeepAlives: !keepAlive, MaxIdleConnsPerHost: 64,
		IdleConnTimeout: 90 * time.Second, ResponseHeaderTimeout: time.Minute}
	if k.h2 {
		t.Protocols = new(http.Protocols)
		t.Protocols.SetUnencryptedHTTP2(true)
	}
	return t
}

// upstreamDialer dials upstream connections marked with the client
// identity id, from src when valid (the client's own address).
func upstreamDialer(id identity.NumericIdentity, src netip.Addr) *net.Dialer {
	k := upstreamKey{id: id, src: src}
	mark := markOf(k.id)
	d := &net.Dialer{Timeout: 10 * time.Second, Control: func(network, address string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, mark)
			if serr != nil || !k.src.IsValid() {
				return
			}
			// A pod's address is not the node's: binding to it needs
			// IP_TRANSPARENT (IPV6_TRANSPARENT).
			if k.src.Is4() {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
			} else {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1)
			}
		}); err != nil {
			return err
		}
		return serr
	}}
	if k.src.IsValid() {
		d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(k.src, 0))
	}
	return d
}

// forIdentity returns the transport of the client identity id, HTTP/2
// (h2c) when h2, its connections from src when valid (the client's own
// address).
func (u *upstreams) forIdentity(id identity.NumericIdentity, h2 bool, src netip.Addr) *http.Transport {
	k := upstreamKey{id: id, h2: h2, src: src}
	u.mu.Lock()
	defer u.mu.Unlock()
	if t, ok := u.byID[k]; ok {
		return t
	}
	if len(u.byID) >= maxUpstreams {
		return newTransport(k, false)
	}
	t := newTransport(k, true)
	u.byID[k] = t
	return t
}
