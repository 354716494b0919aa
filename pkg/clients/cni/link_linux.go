package cni

import (
	"context"
	"crypto/rand"
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
)

// pod is an open pod network namespace with netlink handles for it and
// for the host (the plugin's own netns). Netlink sockets bound to the
// pod's netns avoid switching threads between namespaces.
type pod struct {
	path   string
	ns     netns.NsHandle
	nl     *netlink.Handle // in the pod's netns
	hostNL *netlink.Handle // in the plugin's (host) netns
}

func openPod(path string) (*pod, error) {
	h, err := netns.GetFromPath(path)
	if err != nil {
		return nil, newError(CodeNetns, "open netns %s: %v", path, err)
	}
	nl, err := netlink.NewHandleAt(h, unix.NETLINK_ROUTE)
	if err != nil {
		h.Close()
		return nil, newError(CodeNetns, "netlink in netns %s: %v", path, err)
	}
	hostNL, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		nl.Close()
		h.Close()
		return nil, kernelError("netlink in host netns", err)
	}
	return &pod{path: path, ns: h, nl: nl, hostNL: hostNL}, nil
}

func (p *pod) Close() {
	p.hostNL.Close()
	p.nl.Close()
	p.ns.Close()
}

// veth is the pair an ADD created.
type veth struct {
	hostNL            *netlink.Handle
	hostName, podName string
	hostIndex         int
	podIndex          int
	hostMAC, podMAC   net.HardwareAddr
}

func isLinkNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

// errVethExists says creating the pair failed because a name is taken
// (the host veth's or CNI_IFNAME in the pod's netns).
var errVethExists = errors.New("veth name exists")

// clearStale makes room for this ADD after creating the pair found a name
// taken. As Cilium's ADD does (RemoveIfFromNetNSIfExists), an existing
// CNI_IFNAME in the pod's netns is deleted whatever it is: the runtime
// owns the netns and asks for that name. So are the attachment's own
// leftovers: its endpoint (a runtime retrying an ADD after a partial
// failure, or after losing the answer), its host veth (a veth of the
// attachment's lxc<hash> name; any other link is left alone) and the
// peer's temporary name of earlier plugins (VethNames).
func (c *call) clearStale(ctx context.Context, p *pod, hostName, tmpName string) error {
	err := c.client.endpointDeleteAttachment(ctx, c.args.ContainerID, c.args.IfName)
	if err != nil && !isNotFound(err) && !isCode(err, "endpoint-deleting") {
		return agentError("delete the attachment's earlier endpoint", err)
	}
	if err := deleteVeth(p.hostNL, hostName); err != nil {
		return err
	}
	for _, name := range []string{c.args.IfName, tmpName} {
		if err := deleteLink(p.nl, name); err != nil {
			return err
		}
	}
	return nil
}

// randomMAC returns a locally administered unicast MAC.
func randomMAC() (net.HardwareAddr, error) {
	mac := make(net.HardwareAddr, 6)
	if _, err := rand.Read(mac); err != nil {
		return nil, err
	}
	mac[0] = (mac[0] | 0x02) &^ 0x01
	return mac, nil
}

// createVeth creates hostName in the host netns, up, with its peer
// ifName already in the pod's netns (no move between namespaces: that
// waits for an RCU grace period), both with their MTU and MACs, in one
// netlink request (vethRequest); configure brings the peer up. The
// kernel's echo of the new host link carries both interface indexes (the
// peer's is the host link's IFLA_LINK); a kernel that does not echo a new
// link (before 6.2) costs one lookup. A taken name (either) is
// errVethExists.
func (p *pod) createVeth(hostName, ifName string, mtu int) (*veth, error) {
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
		return nil, errVethExists
	}
	if err != nil {
		return nil, kernelError("create veth "+hostName, err)
	}
	// Until its index is known, the pair is rolled back by name.
	v := &veth{hostNL: p.hostNL, hostName: hostName, podName: ifName, hostMAC: hostMAC, podMAC: podMAC}
	if echo == nil {
		if echo, err = p.hostNL.LinkByName(hostName); err != nil {
			v.rollback()
			return nil, kernelError("look up "+hostName, err)
		}
	}
	a := echo.Attrs()
	if a.Name != hostName || a.Index == 0 || a.ParentIndex == 0 {
		v.rollback()
		return nil, kernelError("create veth "+hostName, fmt.Errorf("kernel answered link %q index %d, peer index %d", a.Name, a.Index, a.ParentIndex))
	}
	v.hostIndex, v.podIndex = a.Index, a.ParentIndex
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
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("veth"))
	data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)
	peer := data.AddRtAttr(nl.VETH_INFO_PEER, nil)
	peer.AddChild(nl.NewIfInfomsg(unix.AF_UNSPEC)) // not up: its own peer is not there yet (ENOTCONN)
	peer.AddRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(ifName))
	peer.AddRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(mtu)))
	peer.AddRtAttr(unix.IFLA_ADDRESS, podMAC)
	peer.AddRtAttr(unix.IFLA_NET_NS_FD, nl.Uint32Attr(uint32(nsFD)))
	req.AddData(info)
	return req
}

// execEcho sends req (with NLM_F_ECHO and NLM_F_ACK) on a new netlink
// socket in the plugin's netns and reads until the kernel's
// acknowledgement, returning the echoed link (nil when the kernel sent
// none) or the request's error.
func (p *pod) execEcho(req *nl.NetlinkRequest) (netlink.Link, error) {
	s, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_ROUTE)
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

// rollback deletes the pair (deleting one end deletes both).
func (v *veth) rollback() {
	_ = v.hostNL.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: v.hostIndex, Name: v.hostName}})
}

// configure brings the pod side up with each address (/32, /128), a
// link route to its gateway and the default route of its family via it,
// IPv4 first. For IPv6 it first makes sure IPv6 is on in the pod's netns
// (disable_ipv6=0 on lo and the interface: runtimes may create netns with
// IPv6 off) and adds the address without duplicate address detection (the
// agent's IPAM owns it; DAD would hold it tentative, unusable, for a
// second). A pod that already routes a family's gateway through another
// attachment (a second CNI_IFNAME in the same netns) keeps its routes:
// this interface gets only its address of that family.
func (p *pod) configure(v *veth, addrs []podAddr) error {
	link := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: v.podIndex, Name: v.podName}}
	for _, a := range addrs {
		if a.ip.Is6() {
			if err := p.enableIPv6(v.podName); err != nil {
				return err
			}
			break
		}
	}
	if err := p.nl.LinkSetUp(link); err != nil {
		return kernelError("set "+v.podName+" up", err)
	}
	for _, a := range addrs {
		addr := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(a.ip, a.ip.BitLen()))}
		if a.ip.Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := p.nl.AddrAdd(link, addr); err != nil {
			return kernelError("add address "+a.ip.String(), err)
		}
		gw := ipNet(netip.PrefixFrom(a.gateway, a.gateway.BitLen()))
		if err := p.nl.RouteAdd(&netlink.Route{LinkIndex: v.podIndex, Dst: gw, Scope: netlink.SCOPE_LINK}); err != nil {
			if errors.Is(err, unix.EEXIST) {
				continue // routed through another attachment already
			}
			return kernelError("add route to gateway "+a.gateway.String(), err)
		}
		def := &netlink.Route{LinkIndex: v.podIndex, Dst: defaultRoute(a.ip), Gw: gw.IP}
		if err := p.nl.RouteAdd(def); err != nil {
			return kernelError("add default route via "+a.gateway.String(), err)
		}
	}
	return nil
}

// defaultRoute is the default destination of ip's family.
func defaultRoute(ip netip.Addr) *net.IPNet {
	if ip.Is4() {
		return ipNet(netip.PrefixFrom(netip.IPv4Unspecified(), 0))
	}
	return ipNet(netip.PrefixFrom(netip.IPv6Unspecified(), 0))
}

// enableIPv6 sets disable_ipv6 to 0 for lo and ifName in the pod's netns
// where it is not already. Sysctls under /proc/sys/net belong to the
// netns of the thread that opens them: this runs on a thread of its own
// that enters the pod's netns and is discarded afterwards.
func (p *pod) enableIPv6(ifName string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := unix.Setns(int(p.ns), unix.CLONE_NEWNET); err != nil {
			errc <- kernelError("enter netns "+p.path, err)
			return
		}
		for _, dev := range []string{"lo", ifName} {
			path := "/proc/sys/net/ipv6/conf/" + dev + "/disable_ipv6"
			cur, err := os.ReadFile(path)
			if err == nil && strings.TrimSpace(string(cur)) == "0" {
				continue
			}
			if err == nil {
				err = os.WriteFile(path, []byte("0"), 0o644)
			}
			if err != nil {
				errc <- kernelError("enable ipv6 on "+dev+" in netns "+p.path, err)
				return
			}
		}
		errc <- nil
	}()
	return <-errc
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
