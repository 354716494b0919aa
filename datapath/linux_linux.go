package datapath

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/ifname"
)

// Linux is the datapath on a Linux host: the host side of each pod's
// veth (created by membrane-cni), its /32 route and sysctls, and the
// gateway device that answers the pods' gateway address. Its methods run
// in the agent's datapath worker pool; it keeps its own small state under
// a mutex (the pool runs operations of different endpoints concurrently).
type Linux struct {
	cfg LinuxConfig
	log *slog.Logger
	nl  *netlink.Handle // bound to the host netns
	ns  *nsRunner       // runs sysctl writes in the host netns; nil: the agent's own
	// hostUDP holds UDP sockets made in the host netns ahead of use
	// (DialHost, with ns); closed by Close.
	hostUDP hostUDP
	bpf     *bpfState // set by Init, closed by Close (with nl)

	// hostSafeMu guards hostSafeExtra: the safety net's peers from the
	// API server's EndpointSlice (SetHostSafePeers).
	hostSafeMu    sync.Mutex
	hostSafeExtra []netip.AddrPort

	// devconf reads host veths' sysctls by netlink (hostSysctlsHold) in
	// a host netns other than the agent's (nil in the agent's own);
	// closed with nl.
	devconf *nl.SocketHandle

	// life is held for reading by every operation that uses nl, and for
	// writing by Close when it closes nl; nlClosed is set then.
	life     sync.RWMutex
	nlClosed bool

	// mu guards everything below.
	mu      sync.Mutex
	hooks   LinuxHooks
	live    map[endpoint.ID]hostLink // realised endpoints
	pending map[int]*teardown        // deferred host veth deletions by ifindex
	// teardownsSync counts the deletions done at once (Teardowns.Sync).
	teardownsSync uint64
	closed        bool

	gc linuxGC // GC's two-pass bookkeeping (own lock)
	// mapFull counts the writes full maps refused (bpf_mapfull_linux.go).
	mapFull mapFullCounts

	// ctStats is the conntrack collector's (guarded by mu); ctStop ends
	// its goroutine (closed by Close; nil: not started).
	ctStats CTGCStats
	ctStop  chan struct{}
	// pins is what the pin checks found; pinStop ends their goroutine
	// (closed by Close; nil: not started).
	pins    pinHealth
	pinStop chan struct{}

	l7    linuxL7   // the L7 proxy (linux_l7_linux.go; own lock)
	nodes nodeState // the node router's (own lock)
	kpr   kprState  // the kube-proxy-free mode's hooks (bpf_kpr_linux.go; own lock)
}

// hostLink is what Linux remembers of a realised endpoint.
type hostLink struct {
	index int
	name  string
	ips   []netip.Addr
}

var _ Datapath = (*Linux)(nil)

// ErrClosed is returned by operations on a closed Linux datapath.
var ErrClosed = errors.New("datapath closed")

// NewLinux returns a Linux datapath; Init opens the host netns and
// creates the gateway device.
func NewLinux(cfg LinuxConfig, log *slog.Logger) (*Linux, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Linux{cfg: cfg, log: log.With("component", "datapath"), live: map[endpoint.ID]hostLink{},
		pending: map[int]*teardown{}}, nil
}

// Name implements Datapath.
func (l *Linux) Name() string { return "linux" }

// phase reports that step name, begun at start, ended (LinuxHooks.Phase).
func (l *Linux) phase(name string, start time.Time) {
	l.mu.Lock()
	f := l.hooks.Phase
	l.mu.Unlock()
	if f != nil {
		f(name, time.Since(start))
	}
}

// SetHooks connects the datapath to the agent's worker pool and endpoint
// deletion; until then deferred teardowns run on timer goroutines.
func (l *Linux) SetHooks(h LinuxHooks) {
	l.mu.Lock()
	l.hooks = h
	l.mu.Unlock()
}

// Init implements Datapath: it opens the host netns, makes sure the
// gateway device exists, is up and holds every gateway address.
// Idempotent.
func (l *Linux) Init(ctx context.Context) error {
	if l.nl == nil {
		if err := l.open(); err != nil {
			return err
		}
	}
	if err := l.ensureGateway(); err != nil {
		return err
	}
	if err := l.initBPF(); err != nil {
		return fmt.Errorf("linux datapath init: %w", err)
	}
	if err := l.inHost(l.setGlobalSysctls); err != nil {
		return fmt.Errorf("linux datapath init: %w", err)
	}
	if l.cfg.Nodes.Masquerade {
		if err := l.ensureMasquerade(); err != nil {
			return fmt.Errorf("linux datapath init: %w", err)
		}
	} else if err := l.removeMasquerade(); err != nil {
		return fmt.Errorf("linux datapath init: %w", err)
	}
	if err := l.initL7(); err != nil {
		return fmt.Errorf("linux datapath init: %w", err)
	}
	if l.cfg.DNSProxyPort != 0 {
		if err := l.proxyRoute(); err != nil {
			return fmt.Errorf("linux datapath init: dns proxy: %w", err)
		}
	}
	if err := l.initKPR(); err != nil {
		return fmt.Errorf("linux datapath init: %w", err)
	}
	if c := l.cfg.Services; c.KubeProxyReplacement && c.ProtectNodePortRange {
		r := c.NodePortRange
		if r == [2]uint16{} {
			r = DefaultNodePortRange
		}
		var changed bool
		if err := l.inHost(func() (err error) { changed, err = protectNodePortRange(r); return err }); err != nil {
			return fmt.Errorf("linux datapath init: %w", err)
		}
		if changed {
			l.log.Info("NodePort range reserved: no host connection gets a source port in it", "range", fmt.Sprintf("%d-%d", r[0], r[1]))
		}
	}
	links, err := l.listLinks()
	if err != nil {
		return fmt.Errorf("linux datapath init: list links: %w", err)
	}
	if n, err := l.sweepTombstones(links); err != nil {
		return fmt.Errorf("linux datapath init: %w", err)
	} else if n > 0 {
		l.log.Info("deleting tombstone veths left by the previous run", "count", n)
	}
	l.log.Info("linux datapath ready", "gateway-device", l.cfg.GatewayDevice, "gateways", l.cfg.Gateways,
		"host-netns", l.cfg.HostNetns, "teardown-delay", l.cfg.TeardownDelay, "bpffs", l.cfg.BPFFS)
	return nil
}

// initBPF opens the BPF state (once) and maps the gateways to the host
// identity in the ipcache.
func (l *Linux) initBPF() error {
	if l.bpf == nil {
		b, err := openBPF(l.cfg)
		if err != nil {
			return err
		}
		l.bpf = b
		go l.readDrops(b.events)
		go l.readFlows(b.flows)
		if l.cfg.PinCheckInterval > 0 {
			l.pinStop = make(chan struct{})
			go l.pinCheckLoop(l.cfg.PinCheckInterval, l.pinStop)
		}
		if l.cfg.CTGC.Interval > 0 {
			l.ctStop = make(chan struct{})
			go l.ctGCLoop(l.ctStop)
		}
	}
	for _, gw := range l.cfg.Gateways {
		if err := l.UpsertIPCache(context.Background(), netip.PrefixFrom(gw, gw.BitLen()), identity.ReservedHost, netip.Addr{}); err != nil {
			return err
		}
	}
	return nil
}

func (l *Linux) open() error {
	if l.cfg.HostNetns == "" {
		nl, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return fmt.Errorf("linux datapath init: netlink: %w", err)
		}
		l.nl = nl
		return nil
	}
	r, err := newNSRunner(l.cfg.HostNetns)
	if err != nil {
		return fmt.Errorf("linux datapath init: %w", err)
	}
	nl, err := netlink.NewHandleAt(r.handle, unix.NETLINK_ROUTE)
	if err != nil {
		r.close()
		return fmt.Errorf("linux datapath init: netlink in %s: %w", l.cfg.HostNetns, err)
	}
	if l.devconf, err = openDevconf(r.handle); err != nil {
		nl.Close()
		r.close()
		return err
	}
	l.nl, l.ns = nl, r
	return nil
}

// ensureGateway creates the dummy gateway device (a port-less bridge if
// the kernel has no dummy driver) if needed and adds the
// gateway addresses as host routes (/32, /128): pods reach the gateway
// through their lxc device because the host answers ARP for its local
// addresses on any interface, and neighbour solicitations for the IPv6
// gateways through the proxy entries neighbours6 adds per host veth.
func (l *Linux) ensureGateway() error {
	name := l.cfg.GatewayDevice
	link, err := l.nl.LinkByName(name)
	if isLinkNotFound(err) {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = name
		addErr := l.nl.LinkAdd(&netlink.Dummy{LinkAttrs: attrs})
		if errors.Is(addErr, unix.EOPNOTSUPP) {
			// Kernels built without the dummy driver: a bridge without
			// ports holds local addresses just as well.
			addErr = l.nl.LinkAdd(&netlink.Bridge{LinkAttrs: attrs})
		}
		if addErr != nil && !errors.Is(addErr, unix.EEXIST) {
			return fmt.Errorf("create gateway device %s: %w", name, addErr)
		}
		link, err = l.nl.LinkByName(name)
	}
	if err != nil {
		return fmt.Errorf("look up gateway device %s: %w", name, err)
	}
	if err := l.nl.LinkSetUp(link); err != nil {
		return fmt.Errorf("set gateway device %s up: %w", name, err)
	}
	for _, gw := range l.cfg.Gateways {
		addr := &netlink.Addr{IPNet: hostNet(gw), Scope: int(netlink.SCOPE_UNIVERSE)}
		if gw.Is6() {
			addr.Flags = unix.IFA_F_NODAD // usable at once (the bridge fallback would run DAD)
		}
		if err := l.nl.AddrReplace(link, addr); err != nil {
			return fmt.Errorf("add gateway %s to %s: %w", gw, name, err)
		}
	}
	return nil
}

// Close implements Datapath: it runs the deferred teardowns still pending, and closes the netlink handle. The
// gateway device and the endpoints stay.
func (l *Linux) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	defer l.closeL7()
	defer l.hostUDP.close()
	if l.ctStop != nil {
		close(l.ctStop)
	}
	if l.pinStop != nil {
		close(l.pinStop)
	}
	var due []*teardown
	for _, t := range l.pending {
		t.timer.Stop() // one already in the pool may run too: deleting is idempotent
		due = append(due, t)
	}
	l.pending = map[int]*teardown{}
	l.mu.Unlock()
	for _, t := range due {
		if err := l.guard(func() error { return l.deleteLink(t.index, t.name) }); err != nil {
			l.log.Warn("host veth teardown at close failed", "interface", t.name, "err", err)
		}
	}
	l.life.Lock()
	l.nlClosed = true
	if l.nl != nil {
		l.nl.Close()
	}
	if l.devconf != nil {
		l.devconf.Close()
	}
	if l.bpf != nil {
		l.closeNodes()
		l.bpf.close()
	}
	l.life.Unlock()
	if l.ns != nil {
		l.ns.close()
	}
	return nil
}

// Realize implements Datapath (see realize).
// The proxy gets the endpoint's L7 configuration first, then the policy
// map redirects to it: the proxy is configured before traffic arrives
// (whether it acknowledged is the revision's proxy wait).
func (l *Linux) Realize(ctx context.Context, ep *endpoint.Endpoint, rev uint64) (r Realized, err error) {
	defer l.phase(PhaseRealize, time.Now())
	r, err = l.realizeL7(ep, rev)
	if err != nil {
		return Realized{}, err
	}
	err = l.guard(func() error {
		_, err := l.realize(ep)
		return err
	})
	return r, err
}

// Remove implements Datapath (see remove).
func (l *Linux) Remove(ctx context.Context, ep *endpoint.Endpoint) error {
	err := l.guard(func() error { return l.remove(ep) })
	if err == nil {
		l.removeL7(ep.ID)
	}
	return err
}

// Check implements Datapath: ErrEndpointMissing if the host interface is
// gone (or its index now names another interface).
func (l *Linux) Check(ctx context.Context, ep *endpoint.Endpoint) error {
	return l.guard(func() error { return l.check(ep) })
}

// guard runs fn unless Close closed the netlink handle.
func (l *Linux) guard(fn func() error) error {
	l.life.RLock()
	defer l.life.RUnlock()
	if l.nlClosed || l.nl == nil {
		return fmt.Errorf("linux datapath: %w", ErrClosed)
	}
	return fn()
}

// realize: the host veth's sysctls (rp_filter off,
// forwarding on) and a /32 (/128) route per pod address to it. An
// endpoint without a host interface has nothing to realise. A chained
// endpoint's veth, routes and sysctls are the other plugin's: only the
// programs are attached (realizeChained).
func (l *Linux) realize(ep *endpoint.Endpoint) (Realized, error) {
	if ep.IfIndex == 0 && ep.IfName == "" {
		return Realized{}, nil
	}
	if ep.Chained {
		return Realized{}, l.realizeChained(ep)
	}
	idx, name := ep.IfIndex, ep.IfName
	if name != "" && !ifname.Managed(name) {
		return Realized{}, fmt.Errorf("realize endpoint %d: host interface %q: %w", ep.ID, name, ErrForeignInterface)
	}
	if idx == 0 || name == "" {
		link, err := l.hostLink(ep)
		if err != nil {
			return Realized{}, fmt.Errorf("realize endpoint %d: %w", ep.ID, err)
		}
		idx, name = link.Attrs().Index, link.Attrs().Name
		if !ifname.Managed(name) {
			return Realized{}, fmt.Errorf("realize endpoint %d: host interface %q (index %d): %w", ep.ID, name, idx, ErrForeignInterface)
		}
	}
	// No lookup first: the sysctls name the interface and the routes its
	// index, and both fail if it is gone.
	start := time.Now()
	l.mu.Lock()
	prev, known := l.live[ep.ID]
	l.mu.Unlock()
	if !known || prev.index != idx || prev.name != name {
		if err := l.setHostSysctls(idx, name); err != nil {
			return Realized{}, fmt.Errorf("realize endpoint %d: %w", ep.ID, missingIf(err, errors.Is(err, os.ErrNotExist), name))
		}
		l.phase(PhaseHostSysctls, start)
	}
	ips := endpointIPs(ep)
	for _, ip := range ips {
		r := &netlink.Route{LinkIndex: idx, Dst: hostNet(ip), Scope: netlink.SCOPE_LINK, Protocol: unix.RTPROT_STATIC}
		err := l.nl.RouteReplace(r)
		if errors.Is(err, unix.ENETDOWN) {
			if err = l.setHostUp(idx, name); err == nil {
				err = l.nl.RouteReplace(r)
			}
		}
		if err != nil {
			err = missingIf(err, errors.Is(err, unix.ENODEV), name)
			return Realized{}, fmt.Errorf("realize endpoint %d: route %s dev %s: %w", ep.ID, ip, name, err)
		}
	}
	if ep.IPv6.IsValid() {
		if err := l.neighbours6(idx, ep); err != nil {
			err = missingIf(err, errors.Is(err, unix.ENODEV), name)
			return Realized{}, fmt.Errorf("realize endpoint %d: %w", ep.ID, err)
		}
	}
	l.phase(PhaseHostSetup, start)
	if err := l.realizeBPF(ep, idx); err != nil {
		return Realized{}, fmt.Errorf("realize endpoint %d: %w", ep.ID, err)
	}
	l.mu.Lock()
	l.live[ep.ID] = hostLink{index: idx, name: name, ips: ips}
	l.mu.Unlock()
	return Realized{}, nil
}

// setHostUp sets the host veth (idx, name) up again. A removal sets it
// down before it renames it to its tombstone, and removes the endpoint's
// state only after: an agent killed between the two restores the
// endpoint with its veth down under its own name, and the endpoint is
// live until its DEL is retried. The kernel refuses a route to a down
// device (ENETDOWN), so realize asks for this only then: no extra call
// on the usual path.
func (l *Linux) setHostUp(idx int, name string) error {
	link, err := l.nl.LinkByIndex(idx)
	switch {
	case isLinkNotFound(err):
		return fmt.Errorf("host interface %s: %w", name, ErrEndpointMissing)
	case err != nil:
		return fmt.Errorf("look up host interface %s: %w", name, err)
	case link.Attrs().Name != name:
		return fmt.Errorf("host interface index %d is %s, not %s: %w", idx, link.Attrs().Name, name, ErrEndpointMissing)
	}
	if err := l.nl.LinkSetUp(link); err != nil {
		return fmt.Errorf("set host interface %s up: %w", name, err)
	}
	l.log.Info("host interface was down; set up", "interface", name)
	return nil
}

// realizeChained attaches the node's programs to a chained endpoint's
// host interface, found by index and checked by name (another plugin's
// veth: the agent never changes its addresses, routes or sysctls).
func (l *Linux) realizeChained(ep *endpoint.Endpoint) error {
	if ep.IfIndex == 0 || ep.IfName == "" {
		return fmt.Errorf("realize chained endpoint %d: host interface index and name required", ep.ID)
	}
	link, err := l.hostLink(ep)
	if err != nil {
		return fmt.Errorf("realize chained endpoint %d: %w", ep.ID, err)
	}
	if link.Type() != "veth" {
		return fmt.Errorf("realize chained endpoint %d: host interface %s is a %s, not a veth: %w", ep.ID, ep.IfName, link.Type(), ErrForeignInterface)
	}
	if err := l.realizeBPF(ep, ep.IfIndex); err != nil {
		return fmt.Errorf("realize chained endpoint %d: %w", ep.ID, err)
	}
	l.mu.Lock()
	l.live[ep.ID] = hostLink{index: ep.IfIndex, name: ep.IfName, ips: endpointIPs(ep)}
	l.mu.Unlock()
	return nil
}

// missingIf wraps err with ErrEndpointMissing when gone says the host
// interface does not exist.
func missingIf(err error, gone bool, name string) error {
	if gone {
		return fmt.Errorf("host interface %s: %w (%v)", name, ErrEndpointMissing, err)
	}
	return err
}

// remove, on the caller's path (the endpoint's deletion, which CNI DEL
// waits for): the endpoint's BPF state and routes go (its address may go
// to another pod), and the host veth is set down and renamed to its
// tombstone (linux_teardown_linux.go), which cuts the pod off; the pair
// is deleted after TeardownDelay if the pod's netns has not taken it by
// then. Negative TeardownDelay deletes it at once. Removing a missing
// endpoint is success.
func (l *Linux) remove(ep *endpoint.Endpoint) error {
	defer l.phase(PhaseRemove, time.Now())
	l.mu.Lock()
	h, known := l.live[ep.ID]
	delete(l.live, ep.ID)
	l.mu.Unlock()
	if !known {
		h = hostLink{index: ep.IfIndex, name: ep.IfName, ips: endpointIPs(ep)}
	}
	if l.bpf != nil {
		start := time.Now()
		if err := l.removeBPF(ep.ID, h.index); err != nil {
			return fmt.Errorf("remove endpoint %d: %w", ep.ID, err)
		}
		l.phase(PhaseRemoveBPF, start)
	}
	if (h.index == 0 && h.name == "") || ep.Chained {
		return nil // a chained endpoint's link and routes are the other plugin's
	}
	if h.name != "" && !ifname.Managed(h.name) {
		// Not an interface the agent manages (a record or queued
		// deletion naming eth0, say): neither its routes nor the link
		// are ours.
		l.log.Warn("not removing a host interface membrane did not create", "endpoint", ep.ID, "interface", h.name)
		return nil
	}
	if h.index == 0 { // known by name only (a queued deletion)
		link, err := l.nl.LinkByName(h.name)
		if isLinkNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("remove endpoint %d: look up %s: %w", ep.ID, h.name, err)
		}
		h.index = link.Attrs().Index
	}
	defer l.phase(PhaseRemoveTombstone, time.Now())
	if err := l.unroute(h); err != nil {
		return fmt.Errorf("remove endpoint %d: %w", ep.ID, err)
	}
	if l.cfg.TeardownDelay < 0 {
		if err := l.deleteLink(h.index, h.name); err != nil {
			return fmt.Errorf("remove endpoint %d: %w", ep.ID, err)
		}
		return nil
	}
	tomb, err := l.tombstone(h)
	if err != nil {
		return fmt.Errorf("remove endpoint %d: %w", ep.ID, err)
	}
	if tomb == "" {
		return nil // gone, or the index names another interface
	}
	if err := l.deferDelete(h.index, tomb); err != nil {
		return fmt.Errorf("remove endpoint %d: %w", ep.ID, err)
	}
	return nil
}

// unroute deletes the routes of h's addresses through its interface;
// routes already gone (or replaced by another pod's) are fine.
func (l *Linux) unroute(h hostLink) error {
	for _, ip := range h.ips {
		err := l.nl.RouteDel(&netlink.Route{LinkIndex: h.index, Dst: hostNet(ip), Scope: netlink.SCOPE_LINK})
		if err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENODEV) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("delete route %s dev %s: %w", ip, h.name, err)
		}
		if ip.Is6() {
			err := l.nl.NeighDel(&netlink.Neigh{LinkIndex: h.index, Family: netlink.FAMILY_V6, IP: ip.AsSlice()})
			if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENODEV) {
				return fmt.Errorf("delete neighbour %s dev %s: %w", ip, h.name, err)
			}
		}
	}
	return nil
}

// submit runs fn in the worker pool (LinuxHooks.Submit), or on a new
// goroutine before the hooks are set.
func (l *Linux) submit(op string, fn func(context.Context) error) {
	l.mu.Lock()
	submit := l.hooks.Submit
	l.mu.Unlock()
	run := func(ctx context.Context) error {
		err := l.guard(func() error { return fn(ctx) })
		if err != nil && !errors.Is(err, ErrClosed) {
			l.log.Warn("datapath work failed", "op", op, "err", err)
		}
		return err
	}
	if submit == nil {
		go func() { _ = run(context.Background()) }()
		return
	}
	submit(op, run)
}

func (l *Linux) check(ep *endpoint.Endpoint) error {
	if ep.IfIndex == 0 && ep.IfName == "" {
		return nil
	}
	if _, err := l.hostLink(ep); err != nil {
		return fmt.Errorf("check endpoint %d: %w", ep.ID, err)
	}
	return nil
}

// hostLink finds the endpoint's host interface by index (checking the
// name) or by name. Returns ErrEndpointMissing if it is gone.
func (l *Linux) hostLink(ep *endpoint.Endpoint) (netlink.Link, error) {
	var link netlink.Link
	var err error
	if ep.IfIndex != 0 {
		link, err = l.nl.LinkByIndex(ep.IfIndex)
	} else {
		link, err = l.nl.LinkByName(ep.IfName)
	}
	switch {
	case isLinkNotFound(err):
		return nil, fmt.Errorf("host interface %s (index %d): %w", ep.IfName, ep.IfIndex, ErrEndpointMissing)
	case err != nil:
		return nil, fmt.Errorf("look up host interface %s: %w", ep.IfName, err)
	case ep.IfName != "" && link.Attrs().Name != ep.IfName:
		return nil, fmt.Errorf("host interface index %d is %s, not %s: %w", ep.IfIndex, link.Attrs().Name, ep.IfName, ErrEndpointMissing)
	}
	return link, nil
}

func isLinkNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

func endpointIPs(ep *endpoint.Endpoint) []netip.Addr {
	var ips []netip.Addr
	for _, ip := range []netip.Addr{ep.IPv4, ep.IPv6} {
		if ip.IsValid() {
			ips = append(ips, ip)
		}
	}
	return ips
}

// hostNet is ip as a host prefix (/32 or /128).
func hostNet(ip netip.Addr) *net.IPNet {
	return &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(ip.BitLen(), ip.BitLen())}
}

// sysctlTimeout bounds a sysctl write in the host netns.
const sysctlTimeout = 5 * time.Second
