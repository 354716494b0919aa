package datapath

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/datapath/nsmount"
)

var _ HealthDatapath = (*Linux)(nil)

// healthPodIf is the health endpoint's interface inside its namespace.
const healthPodIf = "eth0"

// CreateHealth implements HealthDatapath: it removes what spec named
// before, creates the namespace (bind-mounted at spec.Netns), the veth
// with its peer made directly in the namespace, and configures lo, eth0,
// the address and the routes through the gateway. On failure what it
// created is removed again.
func (l *Linux) CreateHealth(ctx context.Context, spec HealthSpec) (hl HealthLink, retErr error) {
	if spec.MTU == 0 {
		spec.MTU = 1500
	}
	if err := l.DeleteHealth(ctx, spec); err != nil {
		return hl, err
	}
	err := l.guard(func() error {
		if err := createNetns(spec.Netns); err != nil {
			return err
		}
		defer func() {
			if retErr != nil {
				_ = removeNetns(spec.Netns)
			}
		}()
		h, err := netns.GetFromPath(spec.Netns)
		if err != nil {
			return fmt.Errorf("open health netns: %w", err)
		}
		defer h.Close()
		hl, err = l.healthVeth(spec, h)
		if err != nil {
			return err
		}
		hl.PodMAC, err = configureHealth(spec, h)
		return err
	})
	if err != nil {
		return hl, fmt.Errorf("create health endpoint: %w", err)
	}
	return hl, nil
}

// healthVeth creates the veth, host side up in the host netns.
func (l *Linux) healthVeth(spec HealthSpec, h netns.NsHandle) (HealthLink, error) {
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU, attrs.Flags = spec.HostIfName, spec.MTU, net.FlagUp
	veth := &netlink.Veth{LinkAttrs: attrs, PeerName: healthPodIf, PeerNamespace: netlink.NsFd(int(h)), PeerMTU: uint32(spec.MTU)}
	if err := l.nl.LinkAdd(veth); err != nil {
		return HealthLink{}, fmt.Errorf("add veth %s: %w", spec.HostIfName, err)
	}
	link, err := l.nl.LinkByName(spec.HostIfName)
	if err != nil {
		return HealthLink{}, fmt.Errorf("look up %s: %w", spec.HostIfName, err)
	}
	return HealthLink{HostIfName: spec.HostIfName, HostIfIndex: link.Attrs().Index, HostMAC: link.Attrs().HardwareAddr.String()}, nil
}

// configureHealth brings lo and eth0 up in the namespace and gives eth0
// each address (/32, /128), a link route to its gateway and the default
// route of its family via it. IPv6 is turned on in the namespace and its
// address skips duplicate address detection (the address is the agent's
// to give). It returns eth0's MAC address.
func configureHealth(spec HealthSpec, h netns.NsHandle) (string, error) {
	for _, a := range spec.Addrs {
		if a.IP.Is6() {
			err := inNetns(spec.Netns, func() error {
				return ensureSysctl("/proc/sys/net/ipv6/conf/all/disable_ipv6", "0")
			})
			if err != nil {
				return "", fmt.Errorf("enable ipv6 in health netns: %w", err)
			}
		}
	}
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		return "", fmt.Errorf("netlink in health netns: %w", err)
	}
	defer nl.Close()
	for _, name := range []string{"lo", healthPodIf} {
		link, err := nl.LinkByName(name)
		if err != nil {
			return "", fmt.Errorf("look up %s in health netns: %w", name, err)
		}
		if err := nl.LinkSetUp(link); err != nil {
			return "", fmt.Errorf("set %s up in health netns: %w", name, err)
		}
	}
	eth, err := nl.LinkByName(healthPodIf)
	if err != nil {
		return "", fmt.Errorf("look up %s in health netns: %w", healthPodIf, err)
	}
	idx := eth.Attrs().Index
	for _, a := range spec.Addrs {
		addr := &netlink.Addr{IPNet: hostNet(a.IP)}
		if a.IP.Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := nl.AddrAdd(eth, addr); err != nil {
			return "", fmt.Errorf("add address %s: %w", a.IP, err)
		}
		if err := nl.RouteAdd(&netlink.Route{LinkIndex: idx, Dst: hostNet(a.Gateway), Scope: netlink.SCOPE_LINK}); err != nil {
			return "", fmt.Errorf("add route to gateway %s: %w", a.Gateway, err)
		}
		def := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		if a.IP.Is6() {
			def = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		}
		dst := &net.IPNet{IP: def.Addr().AsSlice(), Mask: net.CIDRMask(0, def.Addr().BitLen())}
		if err := nl.RouteAdd(&netlink.Route{LinkIndex: idx, Dst: dst, Gw: a.Gateway.AsSlice()}); err != nil {
			return "", fmt.Errorf("add default route via %s: %w", a.Gateway, err)
		}
	}
	return eth.Attrs().HardwareAddr.String(), nil
}

// DeleteHealth implements HealthDatapath.
func (l *Linux) DeleteHealth(ctx context.Context, spec HealthSpec) error {
	err := l.guard(func() error {
		if err := l.deleteLink(0, spec.HostIfName); err != nil {
			return err
		}
		return removeNetns(spec.Netns)
	})
	if err != nil {
		return fmt.Errorf("delete health endpoint: %w", err)
	}
	return nil
}

// ListenHealth implements HealthDatapath.
func (l *Linux) ListenHealth(spec HealthSpec, port int) (net.Listener, error) {
	var lis net.Listener
	err := inNetns(spec.Netns, func() (err error) {
		// The namespace holds only the endpoint's addresses: the
		// wildcard (dual-stack) socket serves each of them.
		lis, err = net.Listen("tcp", ":"+strconv.Itoa(port))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen in health netns: %w", err)
	}
	return lis, nil
}

// DialHost implements HealthDatapath.
func (l *Linux) DialHost(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	if l.cfg.HostNetns == "" {
		return d.DialContext(ctx, network, addr)
	}
	var conn net.Conn
	dial := func() (err error) {
		conn, err = d.DialContext(ctx, network, addr)
		return err
	}
	if strings.HasPrefix(network, "udp") && l.ns != nil {
		// A UDP dial never waits: a socket the host netns's thread
		// made ahead of use is connected here, sparing a trip to that
		// thread per dial (the DNS proxy's upstream queries).
		if ap, err := netip.ParseAddrPort(addr); err == nil && network != "udp4" && network != "udp6" {
			return l.hostUDP.dial(netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), l.inHost)
		}
		return conn, l.inHost(dial)
	}
	return conn, inNetns(l.cfg.HostNetns, dial)
}

// InHost implements HealthDatapath.
func (l *Linux) InHost(fn func() error) error {
	if l.cfg.HostNetns == "" {
		return fn()
	}
	return inNetns(l.cfg.HostNetns, fn)
}

// inNetns runs fn on a new OS thread inside the namespace at path; the
// thread is discarded afterwards (never switched back). Sockets fn makes
// stay in the namespace.
func inNetns(path string, fn func() error) error {
	h, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer h.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := netns.Set(h); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// createNetns creates a network namespace kept alive by a bind mount at
// path.
func createNetns(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return fmt.Errorf("create netns %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("create netns %s: %w", path, err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread is in the new netns
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind mount: %w", err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("create netns %s: %w", path, err)
	}
	return nil
}

// removeNetns unmounts and removes the bind mount at path; a missing one
// is success. Container runtimes make mount namespaces all the time, and
// their copies of the mount can stack on it by propagation, so this is
// nsmount.Remove (every stacked mount, retried while busy).
func removeNetns(path string) error { return nsmount.Remove(path) }
