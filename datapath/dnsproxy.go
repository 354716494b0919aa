package datapath

import (
	"context"
	"net"
	"net/netip"
)

// TransparentSockets is implemented by the Linux datapath: the DNS
// proxy's sockets in the host netns (LinuxConfig.HostNetns), where the
// BPF programs assign the endpoints' DNS traffic to them.
type TransparentSockets interface {
	// ListenTransparent opens UDP and TCP sockets on 127.0.0.1:port
	// (where the BPF programs look for the proxy) with IP_TRANSPARENT, so they accept what is assigned to
	// them whatever its destination; the UDP socket reports each
	// datagram's original destination (OrigDst).
	ListenTransparent(port uint16) (*net.UDPConn, *net.TCPListener, error)
	// BindTransparentUDP opens a UDP socket bound to the non-local
	// address local (a DNS server's), to send replies from it.
	BindTransparentUDP(local netip.AddrPort) (*net.UDPConn, error)
	// DialHost dials addr from the host netns.
	DialHost(ctx context.Context, network, addr string) (net.Conn, error)
}
