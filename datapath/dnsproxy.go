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
	// and [::1]:port (where the BPF programs look for the proxy of each
	// family) with IP_TRANSPARENT (IPV6_TRANSPARENT), so they accept
	// what is assigned to them whatever its destination; the UDP
	// sockets report each datagram's original destination (OrigDst).
	// A netns without IPv6 on its loopback gets the IPv4 sockets alone.
	ListenTransparent(port uint16) (*ProxySockets, error)
	// BindTransparentUDP opens a UDP socket bound to the non-local
	// address local (a DNS server's, either family), to send replies
	// from it.
	BindTransparentUDP(local netip.AddrPort) (*net.UDPConn, error)
	// DialHost dials addr from the host netns.
	DialHost(ctx context.Context, network, addr string) (net.Conn, error)
}

// ProxySockets are a transparent proxy's listening sockets, one of each
// protocol per family the node's loopback has (IPv4 first).
type ProxySockets struct {
	UDP []*net.UDPConn
	TCP []*net.TCPListener
}

// Close closes every socket.
func (s *ProxySockets) Close() {
	for _, c := range s.UDP {
		c.Close()
	}
	for _, l := range s.TCP {
		l.Close()
	}
}
