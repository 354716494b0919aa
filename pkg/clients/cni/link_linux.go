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

	"github.com/vishvananda/netlink"
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
// (the host veth's, the peer's temporary name or CNI_IFNAME).
var errVethExists = errors.New("veth name exists")

// clearStale makes room for this ADD after creating the pair found a name
// taken. As Cilium's ADD does (RemoveIfFromNetNSIfExists), an existing
// CNI_IFNAME in the pod's netns is deleted whatever it is: the runtime
// owns the netns and asks for that name. So are the attachment's own
// leftovers: its endpoint (a runtime retrying an ADD after a partial
// failure, or after losing the answer), its host veth (a veth of the
// attachment's lxc<hash> name; any other link is left alone) and the
// peer's temporary name.
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

// createVeth creates hostName up in the host netns with its peer tmpName
// already in the pod's netns (no move between namespaces: that waits for
// an RCU grace period), then renames the peer to ifName there.
func (p *pod) createVeth(hostName, tmpName, ifName string, mtu int) (v *veth, retErr error) {
	hostMAC, err := randomMAC()
	if err != nil {
		return nil, kernelError("create veth", err)
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU, attrs.Flags, attrs.HardwareAddr = hostName, mtu, net.FlagUp, hostMAC
	link := &netlink.Veth{LinkAttrs: attrs, PeerName: tmpName, PeerNamespace: netlink.NsFd(int(p.ns)), PeerMTU: uint32(mtu)}
	if err := p.hostNL.LinkAdd(link); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil, errVethExists
		}
		return nil, kernelError("create veth "+hostName, err)
	}
	v = &veth{hostNL: p.hostNL, hostName: hostName, podName: ifName, hostIndex: link.Attrs().Index, hostMAC: hostMAC}
	defer func() {
		if retErr != nil {
			v.rollback()
		}
	}()
	peer, err := p.nl.LinkByName(tmpName)
	if err != nil {
		return v, kernelError("look up "+tmpName+" in netns", err)
	}
	if err := p.nl.LinkSetName(peer, ifName); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return v, fmt.Errorf("rename %s to %s: %w", tmpName, ifName, errVethExists)
		}
		return v, kernelError("rename "+tmpName+" to "+ifName, err)
	}
	v.podIndex, v.podMAC = peer.Attrs().Index, peer.Attrs().HardwareAddr
	if v.hostIndex == 0 {
		return v, kernelError("create veth "+hostName, errors.New("no interface index"))
	}
	return v, nil
}

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
