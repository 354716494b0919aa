package datapath

import (
	"context"
	"net"
	"net/netip"
)

// HealthSpec describes the kernel side of the agent's health endpoint: a
// network namespace of its own, kept alive by a bind mount at Netns, with
// a veth whose host side is HostIfName and whose other side is "eth0"
// holding each address of Addrs, routed through its gateway.
type HealthSpec struct {
	// Netns is the path of the namespace's bind mount (a file).
	Netns string
	// HostIfName is the host side of the veth (lxc_health).
	HostIfName string
	// Addrs are the endpoint's addresses, at most one per family.
	Addrs []HealthAddr
	// MTU of both sides of the veth (default 1500).
	MTU int
}

// HealthAddr is one of the health endpoint's addresses and the pods'
// gateway of its family.
type HealthAddr struct {
	IP, Gateway netip.Addr
}

// HealthLink is what CreateHealth made.
type HealthLink struct {
	// HostIfName and HostIfIndex name the host side of the veth.
	HostIfName  string
	HostIfIndex int
	// HostMAC and PodMAC are the MAC addresses of the host side and of
	// eth0 in the namespace.
	HostMAC, PodMAC string
}

// HealthDatapath is implemented by datapaths that can host the agent's
// health endpoint (the Linux datapath). Every method blocks on the kernel:
// the agent calls them from the worker pool or its health goroutine.
type HealthDatapath interface {
	// CreateHealth replaces whatever spec's namespace and veth held
	// before (a previous agent's health endpoint) with new ones.
	CreateHealth(ctx context.Context, spec HealthSpec) (HealthLink, error)
	// DeleteHealth removes the namespace and the veth; missing ones are
	// success.
	DeleteHealth(ctx context.Context, spec HealthSpec) error
	// ListenHealth opens a TCP listener on port of every address inside
	// the namespace (the socket stays in it).
	ListenHealth(spec HealthSpec, port int) (net.Listener, error)
	// DialHost dials addr from the host netns (LinuxConfig.HostNetns).
	DialHost(ctx context.Context, network, addr string) (net.Conn, error)
	// InHost runs fn on a thread inside the host netns (the agent's own
	// when LinuxConfig.HostNetns is empty): sockets fn opens stay there.
	InHost(fn func() error) error
}
