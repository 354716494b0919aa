package podnet

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// ErrNotChainable says the pod's interface is not the pod end of a veth
// whose host end is in the host netns, or lacks an address it is said to
// have (CNI chaining: another plugin made it).
var ErrNotChainable = errors.New("not a veth pair with its host end on the node")

// FindVeth returns the veth pair another plugin made: podName in the
// pod's netns, a veth, whose peer is hostIndex in the host netns, named
// hostName (when given), holding every address of addrs. Returns
// ErrNotChainable, naming what differs.
func (p *Pod) FindVeth(podName string, hostIndex int, hostName string, addrs []netip.Addr) (*Veth, error) {
	pod, err := p.NL.LinkByName(podName)
	if IsLinkNotFound(err) {
		return nil, fmt.Errorf("interface %s in netns %s: %w", podName, p.Path, ErrNotChainable)
	}
	if err != nil {
		return nil, kernelError("look up "+podName+" in netns "+p.Path, err)
	}
	if pod.Type() != "veth" {
		return nil, fmt.Errorf("interface %s in netns %s is a %s: %w", podName, p.Path, pod.Type(), ErrNotChainable)
	}
	peer := pod.Attrs().ParentIndex
	if hostIndex == 0 {
		hostIndex = peer
	}
	if peer == 0 || peer != hostIndex {
		return nil, fmt.Errorf("interface %s in netns %s: peer index %d, want %d: %w", podName, p.Path, peer, hostIndex, ErrNotChainable)
	}
	host, err := p.HostNL.LinkByIndex(hostIndex)
	if IsLinkNotFound(err) {
		return nil, fmt.Errorf("host interface index %d: %w", hostIndex, ErrNotChainable)
	}
	if err != nil {
		return nil, kernelError(fmt.Sprintf("look up host interface index %d", hostIndex), err)
	}
	ha := host.Attrs()
	if host.Type() != "veth" || ha.ParentIndex != pod.Attrs().Index || (hostName != "" && ha.Name != hostName) {
		return nil, fmt.Errorf("host interface index %d is %s (%s, peer %d), not %s's peer %q: %w",
			hostIndex, ha.Name, host.Type(), ha.ParentIndex, podName, hostName, ErrNotChainable)
	}
	have, err := p.NL.AddrList(pod, netlink.FAMILY_ALL)
	if err != nil {
		return nil, kernelError("list addresses of "+podName, err)
	}
	for _, want := range addrs {
		if !hasAddr(have, want) {
			return nil, fmt.Errorf("interface %s in netns %s lacks address %s: %w", podName, p.Path, want, ErrNotChainable)
		}
	}
	return &Veth{HostName: ha.Name, PodName: podName, HostIndex: ha.Index, PodIndex: pod.Attrs().Index,
		HostMAC: ha.HardwareAddr, PodMAC: pod.Attrs().HardwareAddr}, nil
}

func hasAddr(have []netlink.Addr, want netip.Addr) bool {
	for _, a := range have {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == want {
			return true
		}
	}
	return false
}
