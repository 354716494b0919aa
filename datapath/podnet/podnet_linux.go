package podnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/datapath/sysctl"
	"github.com/membrane-cni/membrane/pkg/domain/ifname"
)

// Kind says what an Error is about.
type Kind int

const (
	// KindKernel: a netlink or sysctl operation failed.
	KindKernel Kind = iota
	// KindNetns: the pod's netns cannot be opened or entered.
	KindNetns
)

// Error is a failure of this package: Op names what was being done.
type Error struct {
	Kind Kind
	Op   string
	Err  error
}

func (e *Error) Error() string { return e.Op + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

func kernelError(op string, err error) error {
	var pe *Error
	if errors.As(err, &pe) {
		return pe
	}
	return &Error{Kind: KindKernel, Op: op, Err: err}
}

// Pod is an open pod network namespace with netlink handles for it and
// for the host netns (where the host end of the veth lives). Netlink
// sockets bound to the pod's netns avoid switching threads between
// namespaces.
type Pod struct {
	Path   string
	ns     netns.NsHandle
	host   netns.NsHandle  // netns.None(): the caller's own netns
	NL     *netlink.Handle // in the pod's netns
	HostNL *netlink.Handle // in the host netns
}

// Open opens the netns at path. host is the host netns (netns.None():
// the calling process's netns); the caller keeps it open while the Pod
// is used.
func Open(path string, host netns.NsHandle) (*Pod, error) {
	h, err := openNetns(path)
	if err != nil {
		return nil, &Error{Kind: KindNetns, Op: "open netns " + path, Err: err}
	}
	pnl, err := netlink.NewHandleAt(h, unix.NETLINK_ROUTE)
	if err != nil {
		h.Close()
		return nil, &Error{Kind: KindNetns, Op: "netlink in netns " + path, Err: err}
	}
	var hostNL *netlink.Handle
	if host == netns.None() {
		hostNL, err = netlink.NewHandle(unix.NETLINK_ROUTE)
	} else {
		hostNL, err = netlink.NewHandleAt(host, unix.NETLINK_ROUTE)
	}
	if err != nil {
		pnl.Close()
		h.Close()
		return nil, kernelError("netlink in host netns", err)
	}
	return &Pod{Path: path, ns: h, host: host, NL: pnl, HostNL: hostNL}, nil
}

// openNetns opens a namespace file: without blocking (a FIFO at the
// path must not hang the caller) and only on nsfs (a network namespace
// is then checked by entering it).
func openNetns(path string) (netns.NsHandle, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return netns.None(), err
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		unix.Close(fd)
		return netns.None(), err
	}
	if st.Type != unix.NSFS_MAGIC {
		unix.Close(fd)
		return netns.None(), fmt.Errorf("not a namespace (file system type %#x)", st.Type)
	}
	return netns.NsHandle(fd), nil
}

// Close closes the handles (not the links).
func (p *Pod) Close() {
	p.HostNL.Close()
	p.NL.Close()
	p.ns.Close()
}

// Veth is the pair an ADD created.
type Veth struct {
	hostNL            *netlink.Handle
	HostName, PodName string
	HostIndex         int
	PodIndex          int
	HostMAC, PodMAC   net.HardwareAddr
}

// IsLinkNotFound reports whether err says the link does not exist.
func IsLinkNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

var (
	// ErrVethExists says creating the pair failed because a name is taken
	// (the host veth's or the interface's in the pod's netns).
	ErrVethExists = errors.New("veth name exists")
	// ErrNotVeth says TombstoneVeth found a link of another kind.
	ErrNotVeth = errors.New("not a veth")
)

// ClearLinks makes room for an ADD after CreateVeth found a name taken:
// it deletes the host veth hostName (a veth of that name; any other link
// is left alone) and the links podNames in the pod's netns, whatever
// they are (as Cilium's ADD does, RemoveIfFromNetNSIfExists: the
// runtime owns the netns and asks for that name).
func (p *Pod) ClearLinks(hostName string, podNames ...string) error {
	if err := DeleteVeth(p.HostNL, hostName); err != nil {
		return err
	}
	for _, name := range podNames {
		if err := DeleteLink(p.NL, name); err != nil {
			return err
		}
	}
	return nil
}

// randomMAC returns a locally administered unicast MAC. Its bytes come
// from getrandom(2), the source crypto/rand reads on Linux, called
// directly: crypto/rand (with math/big and the FIPS DRBG behind it) is
// the CNI plugin's largest import, initialised on every exec for a
// function only the agent calls.
func randomMAC() (net.HardwareAddr, error) {
	mac := make(net.HardwareAddr, 6)
	for n := 0; n < len(mac); {
		m, err := unix.Getrandom(mac[n:], 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("getrandom: %w", err)
		}
		n += m
	}
	mac[0] = (mac[0] | 0x02) &^ 0x01
	return mac, nil
}

// CreateVeth creates hostName in the host netns, up, with its peer
// ifName already in the pod's netns (no move between namespaces: that
// waits for an RCU grace period), both with their MTU and MACs, in one
// netlink request (vethRequest); Configure brings the peer up. The
// kernel's echo of the new host link carries both interface indexes (the
// peer's is the host link's IFLA_LINK); a kernel that does not echo a new
// link (before 6.2) costs one lookup. A taken name (either) is
// ErrVethExists.
func (p *Pod) CreateVeth(hostName, ifName string, mtu int) (*Veth, error) {
	hostMAC, err := randomMAC()
	if err != nil {
		return nil, kernelError("create veth", err)
	}
	podMAC, err := randomMAC()
	if err != nil {
		return nil, kernelError("create veth", err)
	}
	echo, err := p.execEcho(vethRequest(hostName, ifName, mtu, hostMAC, podMAC, int(p.ns)))
	if errors.Is(err, unix.EEXIST) {
		return nil, ErrVethExists
	}
	if err != nil {
		return nil, kernelError("create veth "+hostName, err)
	}
	// Until its index is known, the pair is rolled back by name.
	v := &Veth{hostNL: p.HostNL, HostName: hostName, PodName: ifName, HostMAC: hostMAC, PodMAC: podMAC}
	if echo == nil {
		if echo, err = p.HostNL.LinkByName(hostName); err != nil {
			v.Rollback()
			return nil, kernelError("look up "+hostName, err)
		}
	}
	a := echo.Attrs()
	if a.Name != hostName || a.Index == 0 || a.ParentIndex == 0 {
		v.Rollback()
		return nil, kernelError("create veth "+hostName, fmt.Errorf("kernel answered link %q index %d, peer index %d", a.Name, a.Index, a.ParentIndex))
	}
	v.HostIndex, v.PodIndex = a.Index, a.ParentIndex
	return v, nil
}

// vethRequest is RTM_NEWLINK for a veth hostName (in the netns of the
// socket that sends it), up, whose peer ifName is created in the netns
// nsFD; both get mtu and their MAC.
func vethRequest(hostName, ifName string, mtu int, hostMAC, podMAC net.HardwareAddr, nsFD int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK|unix.NLM_F_ECHO)
	host := nl.NewIfInfomsg(unix.AF_UNSPEC)
	host.Flags, host.Change = unix.IFF_UP, unix.IFF_UP
	req.AddData(host)
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(hostName)))
	req.AddData(nl.NewRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(mtu))))
	req.AddData(nl.NewRtAttr(unix.IFLA_ADDRESS, hostMAC))
	// One queue each way, said outright: without these the kernel makes
	// a veth with a queue per possible CPU and then cuts it to one, and
	// that cut waits for an RCU grace period under the rtnl lock
	// (veth_init_queues, netif_set_real_num_tx_queues), once per end.
	req.AddData(nl.NewRtAttr(unix.IFLA_NUM_TX_QUEUES, nl.Uint32Attr(1)))
	req.AddData(nl.NewRtAttr(unix.IFLA_NUM_RX_QUEUES, nl.Uint32Attr(1)))
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("veth"))
	data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)
	peer := data.AddRtAttr(nl.VETH_INFO_PEER, nil)
	peer.AddChild(nl.NewIfInfomsg(unix.AF_UNSPEC)) // not up: its own peer is not there yet (ENOTCONN)
	peer.AddRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(ifName))
	peer.AddRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(mtu)))
	peer.AddRtAttr(unix.IFLA_ADDRESS, podMAC)
	peer.AddRtAttr(unix.IFLA_NUM_TX_QUEUES, nl.Uint32Attr(1))
	peer.AddRtAttr(unix.IFLA_NUM_RX_QUEUES, nl.Uint32Attr(1))
	peer.AddRtAttr(unix.IFLA_NET_NS_FD, nl.Uint32Attr(uint32(nsFD)))
	req.AddData(info)
	return req
}

// execEcho sends req (with NLM_F_ECHO and NLM_F_ACK) on a new netlink
// socket in the host netns and reads until the kernel's acknowledgement,
// returning the echoed link (nil when the kernel sent none) or the
// request's error.
func (p *Pod) execEcho(req *nl.NetlinkRequest) (netlink.Link, error) {
	s, err := nl.GetNetlinkSocketAt(p.host, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if err := s.SetReceiveTimeout(&netlinkTimeout); err != nil {
		return nil, err
	}
	if err := s.Send(req); err != nil {
		return nil, err
	}
	var echo netlink.Link
	for {
		msgs, from, err := s.Receive()
		if err != nil {
			return nil, err
		}
		if from.Pid != nl.PidKernel {
			continue
		}
		for _, m := range msgs {
			if m.Header.Seq != req.Seq {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return nil, errors.New("short netlink error message")
				}
				if errno := int32(nl.NativeEndian().Uint32(m.Data[:4])); errno != 0 {
					return nil, unix.Errno(-errno)
				}
				return echo, nil
			case unix.RTM_NEWLINK:
				hdr := unix.NlMsghdr{Len: m.Header.Len, Type: m.Header.Type, Flags: m.Header.Flags, Seq: m.Header.Seq, Pid: m.Header.Pid}
				if echo, err = netlink.LinkDeserialize(&hdr, m.Data); err != nil {
					return nil, fmt.Errorf("parse the kernel's echo: %w", err)
				}
			}
		}
	}
}

// netlinkTimeout bounds a wait for the kernel's answer.
var netlinkTimeout = unix.NsecToTimeval((30 * time.Second).Nanoseconds())

// Rollback deletes the pair (deleting one end deletes both).
func (v *Veth) Rollback() {
	_ = v.hostNL.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: v.HostIndex, Name: v.HostName}})
}

// Addr is one of the pod's addresses and its family's gateway.
type Addr struct {
	IP, Gateway netip.Addr
}

// Configure brings the pod side up with each address (/32, /128), a
// link route to its gateway and the default route of its family via it,
// IPv4 first. For IPv6 it first makes sure IPv6 is on in the pod's netns
// (disable_ipv6=0 on lo and the interface: runtimes may create netns with
// IPv6 off) and adds the address without duplicate address detection (the
// agent's IPAM owns it; DAD would hold it tentative, unusable, for a
// second). A pod that already routes a family's gateway through another
// attachment (a second CNI_IFNAME in the same netns) keeps its routes:
// this interface gets only its address of that family. Both routes carry
// mtu (0: none, the interface's): in tunnel mode it leaves room for the
// encapsulation (ip route shows "mtu N").
func (p *Pod) Configure(v *Veth, addrs []Addr, mtu int) error {
	link := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: v.PodIndex, Name: v.PodName}}
	for _, a := range addrs {
		if a.IP.Is6() {
			if err := p.enableIPv6(v.PodName); err != nil {
				return err
			}
			break
		}
	}
	if err := p.NL.LinkSetUp(link); err != nil {
		return kernelError("set "+v.PodName+" up", err)
	}
	for _, a := range addrs {
		addr := &netlink.Addr{IPNet: IPNet(netip.PrefixFrom(a.IP, a.IP.BitLen()))}
		if a.IP.Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := p.NL.AddrAdd(link, addr); err != nil {
			return kernelError("add address "+a.IP.String(), err)
		}
		gw := IPNet(netip.PrefixFrom(a.Gateway, a.Gateway.BitLen()))
		if a.IP.Is6() && len(v.HostMAC) == 6 {
			// The gateway's neighbour entry, permanent: the pod never
			// solicits it. The host answers a solicitation for it only
			// through a proxy entry on the host veth, which the kernel
			// drops whenever that veth's carrier goes down
			// (neigh_carrier_down), and the first carrier event of a
			// new pair can come after the agent added the entry: the
			// pod then never reached its IPv6 gateway
			// (TestHostPolicyLocalPods at load 15-20).
			n := &netlink.Neigh{LinkIndex: v.PodIndex, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT,
				IP: a.Gateway.AsSlice(), HardwareAddr: v.HostMAC}
			if err := p.NL.NeighSet(n); err != nil {
				return kernelError("add neighbour "+a.Gateway.String(), err)
			}
		}
		if err := p.NL.RouteAdd(&netlink.Route{LinkIndex: v.PodIndex, Dst: gw, Scope: netlink.SCOPE_LINK, MTU: mtu}); err != nil {
			if errors.Is(err, unix.EEXIST) {
				continue // routed through another attachment already
			}
			return kernelError("add route to gateway "+a.Gateway.String(), err)
		}
		def := &netlink.Route{LinkIndex: v.PodIndex, Dst: DefaultRoute(a.IP), Gw: gw.IP, MTU: mtu}
		if err := p.NL.RouteAdd(def); err != nil {
			return kernelError("add default route via "+a.Gateway.String(), err)
		}
	}
	return nil
}

// DefaultRoute is the default destination of ip's family.
func DefaultRoute(ip netip.Addr) *net.IPNet {
	if ip.Is4() {
		return IPNet(netip.PrefixFrom(netip.IPv4Unspecified(), 0))
	}
	return IPNet(netip.PrefixFrom(netip.IPv6Unspecified(), 0))
}

// enableIPv6 sets disable_ipv6 to 0 for lo and ifName in the pod's netns
// where it is not already. Sysctls under /proc/sys/net belong to the
// netns of the thread that opens them: this runs on a thread of its own
// that enters the pod's netns and is discarded afterwards.
func (p *Pod) enableIPv6(ifName string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := unix.Setns(int(p.ns), unix.CLONE_NEWNET); err != nil {
			errc <- &Error{Kind: KindNetns, Op: "enter netns " + p.Path, Err: err}
			return
		}
		for _, dev := range []string{"lo", ifName} {
			path := sysctl.Path("net/ipv6/conf/" + dev + "/disable_ipv6")
			cur, err := os.ReadFile(path)
			if err == nil && strings.TrimSpace(string(cur)) == "0" {
				continue
			}
			if err == nil {
				err = os.WriteFile(path, []byte("0"), 0o644)
			}
			if err != nil {
				errc <- kernelError("enable ipv6 on "+dev+" in netns "+p.Path, err)
				return
			}
		}
		errc <- nil
	}()
	return <-errc
}

// IPNet converts p.
func IPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// TombstoneVeth sets the veth called name down and renames it to its
// tombstone (ifname.Tombstone of its index), through h: the name is free
// at once, and the pair goes when its other end is deleted (or its
// netns). A missing link is success; a link of that name that is not a
// veth is ErrNotVeth (it has no other end to go with: delete it).
func TombstoneVeth(h *netlink.Handle, name string) error {
	link, err := h.LinkByName(name)
	if IsLinkNotFound(err) {
		return nil
	}
	if err != nil {
		return kernelError("look up "+name, err)
	}
	if link.Type() != "veth" {
		return kernelError("tombstone "+name, ErrNotVeth)
	}
	if err := h.LinkSetDown(link); err != nil {
		return kernelError("set "+name+" down", err)
	}
	tomb := ifname.Tombstone(link.Attrs().Index)
	if err := h.LinkSetName(link, tomb); err != nil {
		return kernelError("rename "+name+" to "+tomb, err)
	}
	return nil
}

// DeleteVeth deletes the veth called name through h; a missing link is
// success and a link of that name that is not a veth is left alone.
func DeleteVeth(h *netlink.Handle, name string) error { return deleteLink(h, name, "veth") }

// DeleteLink deletes the link called name through h; missing is success.
func DeleteLink(h *netlink.Handle, name string) error { return deleteLink(h, name, "") }

// deleteLink deletes the link called name if it is of kind ("": any).
func deleteLink(h *netlink.Handle, name, kind string) error {
	link, err := h.LinkByName(name)
	if IsLinkNotFound(err) {
		return nil
	}
	if err != nil {
		return kernelError("look up "+name, err)
	}
	if kind != "" && link.Type() != kind {
		return nil
	}
	if err := h.LinkDel(link); err != nil && !IsLinkNotFound(err) {
		return kernelError("delete "+name, err)
	}
	return nil
}
