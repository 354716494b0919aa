package datapath

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/bpf"
)

// nodeRouteProto marks the routes to other nodes' pod CIDRs (rtm_protocol),
// so that a sync finds the ones it owns, also those a previous agent left.
const nodeRouteProto = netlink.RouteProtocol(0x4d)

// Pins of the overlay programs' links and the tunnel map under BPFFS.
const (
	pinOverlayDir     = "overlay"
	pinTunnelMap      = "tunnel"
	pinTunnelNodesMap = "tunnel_nodes"
)

var (
	hookToOverlay   = hook{pin: "to", tcx: ebpf.AttachTCXEgress, parent: netlink.HANDLE_MIN_EGRESS, name: "membrane-to-ovl"}
	hookFromOverlay = hook{pin: "from", tcx: ebpf.AttachTCXIngress, parent: netlink.HANDLE_MIN_INGRESS, name: "membrane-from-ovl"}
)

var _ NodeRouter = (*Linux)(nil)

// nodeState is the node router's: the overlay programs, the tunnel map
// and the tunnel_nodes map, loaded on the first tunnel-mode sync.
type nodeState struct {
	mu       sync.Mutex // one sync at a time
	from, to *ebpf.Program
	tunnel   *ebpf.Map // remote pod CIDR -> node (to_overlay's destination)
	// tunnelNodes: each address of each remote node -> the node's tunnel
	// address; from_overlay accepts only these as outer sources.
	tunnelNodes *ebpf.Map
	// masqRemote are the remote pod CIDRs the masquerade chain last
	// excluded (coverPrefixes form).
	masqRemote []netip.Prefix
}

func (n *nodeState) close() {
	for _, p := range []*ebpf.Program{n.from, n.to} {
		if p != nil {
			p.Close()
		}
	}
	for _, m := range []*ebpf.Map{n.tunnel, n.tunnelNodes} {
		if m != nil {
			m.Close()
		}
	}
	n.from, n.to, n.tunnel, n.tunnelNodes = nil, nil, nil, nil
}

// SyncNodes implements NodeRouter. Native routing: a route per remote
// pod CIDR via the node's address of that family. Tunnel mode: the
// VXLAN device (created on first use, external mode, the overlay
// programs on it), a route per remote pod CIDR into it, and the tunnel
// map (pod CIDR -> node) the overlay program picks the outer destination
// from when the ipcache has no tunnel endpoint for the destination.
// Routes (and tunnel map entries) of nodes no longer in the set go.
func (l *Linux) SyncNodes(ctx context.Context, nodes []RemoteNode) error {
	if err := ValidateNodes(nodes); err != nil {
		return fmt.Errorf("sync nodes: %w", err)
	}
	return l.guardBPF(func(b *bpfState) error {
		l.nodes.mu.Lock()
		defer l.nodes.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("sync nodes: %w", err)
		}
		linkIndex := 0
		if l.cfg.Nodes.Routing == RoutingTunnel {
			dev, err := l.syncTunnel(b, nodes)
			if err != nil {
				return fmt.Errorf("sync nodes: %w", err)
			}
			linkIndex = dev.Attrs().Index
		}
		// Pod-to-pod traffic to a new node is left alone before its
		// route exists.
		if err := l.syncMasquerade(nodes); err != nil {
			return fmt.Errorf("sync nodes: %w", err)
		}
		if err := l.syncNodeRoutes(l.nodeRoutes(nodes, linkIndex)); err != nil {
			return fmt.Errorf("sync nodes: %w", err)
		}
		if l.cfg.Nodes.Routing == RoutingNative {
			// No direct delivery to a tunnel device, before it goes.
			if err := setTunnelIfindex(b, 0); err != nil {
				return fmt.Errorf("sync nodes: %w", err)
			}
			// A tunnel device left by a tunnel-mode agent goes (its routes went above).
			if err := l.removeTunnel(b); err != nil {
				return fmt.Errorf("sync nodes: %w", err)
			}
			// Without a tunnel device, pods may use the port again.
			if err := setTunnelPort(b, 0); err != nil {
				return fmt.Errorf("sync nodes: %w", err)
			}
		}
		return nil
	})
}

// syncTunnel makes the tunnel mode's kernel state: the endpoint
// programs told the tunnel port before the device exists (no moment in
// which a pod reaches the VXLAN socket), the overlay maps filled before
// the programs are attached (a from_overlay replacing an older one knows
// the nodes at once), then the device with the programs on it.
func (l *Linux) syncTunnel(b *bpfState, nodes []RemoteNode) (netlink.Link, error) {
	if err := setTunnelPort(b, l.cfg.Nodes.TunnelPort); err != nil {
		return nil, err
	}
	if err := l.loadOverlay(b); err != nil {
		return nil, err
	}
	if err := l.syncTunnelMap(nodes); err != nil {
		return nil, err
	}
	dev, err := l.ensureTunnel(b)
	if err != nil {
		return nil, err
	}
	// Direct delivery both ways once the overlay programs are on the
	// device (bpf/overlay.c, overlay_deliver).
	if err := setTunnelIfindex(b, dev.Attrs().Index); err != nil {
		return nil, err
	}
	return dev, nil
}

// removeTunnel deletes the tunnel device if it is ours (an external-mode
// vxlan of that name) and the overlay programs' pinned links.
func (l *Linux) removeTunnel(b *bpfState) error {
	dev, err := l.nl.LinkByName(l.cfg.Nodes.TunnelDevice)
	if isLinkNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up tunnel device: %w", err)
	}
	if vx, ok := dev.(*netlink.Vxlan); !ok || !vx.FlowBased {
		return nil // not ours
	}
	for _, h := range []hook{hookToOverlay, hookFromOverlay} {
		lk, err := detachTCX(filepath.Join(b.dir, pinOverlayDir), h)
		if err != nil {
			return err
		}
		if lk != nil {
			lk.Close()
		}
		b.releaseLink(filepath.Join(b.dir, pinOverlayDir, h.pin))
	}
	if err := l.nl.LinkDel(dev); err != nil && !isLinkNotFound(err) {
		return fmt.Errorf("delete tunnel device %s: %w", l.cfg.Nodes.TunnelDevice, err)
	}
	l.log.Info("tunnel device removed (native routing)", "device", l.cfg.Nodes.TunnelDevice)
	return nil
}

// nodeRoutes are the desired routes by destination: into the tunnel
// device (linkIndex != 0) or via the node's address of the CIDR's family.
func (l *Linux) nodeRoutes(nodes []RemoteNode, linkIndex int) map[netip.Prefix]*netlink.Route {
	out := map[netip.Prefix]*netlink.Route{}
	for _, n := range nodes {
		if len(n.Addrs) == 0 {
			continue // nowhere to send its pods' traffic yet
		}
		for _, p := range n.PodCIDRs {
			r := &netlink.Route{Dst: prefixNet(p), Protocol: nodeRouteProto, Table: unix.RT_TABLE_MAIN}
			if linkIndex != 0 {
				r.LinkIndex, r.Scope = linkIndex, netlink.SCOPE_LINK
				// The host's own traffic to the node's pods leaves from the
				// address this node reaches that node from, one the far
				// side knows as ours (its tunnel_nodes), so it takes it
				// for our host (remote-node), not for world. Without a
				// source the kernel picks by prefix, for IPv6 the pod
				// gateway's address, which no other node knows.
				fam := netlink.FAMILY_V6
				if p.Addr().Is4() {
					fam = netlink.FAMILY_V4
				}
				if src, ok := l.sourceToward(fam, n.Addrs); ok {
					r.Src = src.AsSlice()
				}
				out[p] = r
				continue
			}
			gw, ok := addrOfFamily(n.Addrs, p.Addr().Is4())
			if !ok {
				l.log.Warn("native routing: node has no address of its pod CIDR's family; CIDR not routed", "node", n.Name, "cidr", p)
				continue
			}
			r.Gw = gw.AsSlice()
			out[p] = r
		}
	}
	return out
}

// syncNodeRoutes deletes the node routes not in want (or different) and
// replaces the wanted ones.
func (l *Linux) syncNodeRoutes(want map[netip.Prefix]*netlink.Route) error {
	have, err := l.nl.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: nodeRouteProto, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("list node routes: %w", err)
	}
	// Routes already as desired are left alone (the periodic full sync
	// costs one dump); only missing or different ones are written.
	ok := make(map[netip.Prefix]bool, len(have))
	for i := range have {
		r := &have[i]
		p, parsed := netPrefix(r.Dst)
		if w := want[p]; parsed && w != nil && w.LinkIndex == r.LinkIndex && net.IP(w.Src).Equal(r.Src) && (w.LinkIndex != 0 || net.IP(w.Gw).Equal(r.Gw)) {
			ok[p] = true
			continue
		}
		if err := l.nl.RouteDel(r); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("delete node route %s: %w", r.Dst, err)
		}
	}
	for p, r := range want {
		if ok[p] {
			continue
		}
		if err := l.nl.RouteReplace(r); err != nil {
			return fmt.Errorf("route %s: %w", p, err)
		}
	}
	return nil
}

// ensureTunnel creates the VXLAN device (external mode, NOARP, up) if
// needed and attaches the overlay programs to it.
func (l *Linux) ensureTunnel(b *bpfState) (netlink.Link, error) {
	c := l.cfg.Nodes
	dev, err := l.nl.LinkByName(c.TunnelDevice)
	if isLinkNotFound(err) {
		attrs := netlink.NewLinkAttrs()
		attrs.Name, attrs.MTU = c.TunnelDevice, c.TunnelMTU
		vx := &netlink.Vxlan{LinkAttrs: attrs, FlowBased: true, Port: c.TunnelPort, Learning: false}
		if err := l.nl.LinkAdd(vx); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("create tunnel device %s: %w", c.TunnelDevice, err)
		}
		dev, err = l.nl.LinkByName(c.TunnelDevice)
	}
	if err != nil {
		return nil, fmt.Errorf("look up tunnel device %s: %w", c.TunnelDevice, err)
	}
	if vx, ok := dev.(*netlink.Vxlan); !ok || !vx.FlowBased {
		return nil, fmt.Errorf("tunnel device %s exists and is not an external-mode vxlan device: %w", c.TunnelDevice, ErrForeignInterface)
	}
	if dev.Attrs().RawFlags&unix.IFF_NOARP == 0 {
		if err := l.nl.LinkSetARPOff(dev); err != nil {
			return nil, fmt.Errorf("tunnel device %s: arp off: %w", c.TunnelDevice, err)
		}
	}
	if dev.Attrs().Flags&net.FlagUp == 0 {
		if err := l.nl.LinkSetUp(dev); err != nil {
			return nil, fmt.Errorf("set tunnel device %s up: %w", c.TunnelDevice, err)
		}
	}
	if err := l.inHost(func() error { return ensureSysctl("/proc/sys/net/ipv4/conf/"+c.TunnelDevice+"/rp_filter", "0") }); err != nil {
		return nil, err
	}
	if err := l.attachOverlay(b, dev.Attrs().Index); err != nil {
		return nil, err
	}
	return dev, nil
}

// attachOverlay loads the overlay programs (once) and attaches them to
// the tunnel device (pinned TCX links, updated in place; cls_bpf when
// forced or where TCX is missing: attachDevice).
func (l *Linux) attachOverlay(b *bpfState, ifindex int) error {
	if err := l.loadOverlay(b); err != nil {
		return err
	}
	dir := filepath.Join(b.dir, pinOverlayDir)
	for _, a := range []struct {
		h    hook
		prog *ebpf.Program
	}{{hookToOverlay, l.nodes.to}, {hookFromOverlay, l.nodes.from}} {
		if err := l.attachDevice(b, dir, a.h, ifindex, a.prog); err != nil {
			return err
		}
	}
	return nil
}

// loadOverlay loads the overlay object with the shared ipcache and the
// pinned tunnel map.
func (l *Linux) loadOverlay(b *bpfState) error {
	if l.nodes.to != nil {
		return nil
	}
	spec, err := bpf.LoadOverlay()
	if err != nil {
		return fmt.Errorf("parse overlay object: %w", err)
	}
	// The shared ipcache replaces the object's: its size is the agent's.
	spec.Maps[bpf.OverlayMapIpcache].MaxEntries = b.maps.ipcache.MaxEntries()
	spec.Maps[bpf.OverlayMapCt].MaxEntries = b.maps.ct.MaxEntries()
	spec.Maps[bpf.OverlayMapEndpoints].MaxEntries = b.maps.endpoints.MaxEntries()
	if err := os.MkdirAll(filepath.Join(b.dir, pinOverlayDir), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", pinOverlayDir, err)
	}
	tunnel, err := openOverlayMap(spec, bpf.OverlayMapTunnel, filepath.Join(b.dir, pinTunnelMap))
	if err != nil {
		return err
	}
	tnodes, err := openOverlayMap(spec, bpf.OverlayMapTunnelNodes, filepath.Join(b.dir, pinTunnelNodesMap))
	if err != nil {
		tunnel.Close()
		return err
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{
		MapReplacements: map[string]*ebpf.Map{bpf.OverlayMapIpcache: b.maps.ipcache, bpf.OverlayMapTunnel: tunnel,
			bpf.OverlayMapTunnelNodes: tnodes, bpf.OverlayMapDrops: b.maps.drops, bpf.OverlayMapEvents: b.maps.events,
			bpf.OverlayMapEndpoints: b.maps.endpoints, bpf.OverlayMapCt: b.maps.ct, bpf.OverlayMapNodeConfig: b.maps.config},
	})
	if err != nil {
		tunnel.Close()
		tnodes.Close()
		return fmt.Errorf("load overlay programs: %w", err)
	}
	defer coll.Close()
	l.nodes.tunnel, l.nodes.tunnelNodes = tunnel, tnodes
	b.pinnedMap(filepath.Join(b.dir, pinTunnelMap), tunnel)
	b.pinnedMap(filepath.Join(b.dir, pinTunnelNodesMap), tnodes)
	l.nodes.to = coll.DetachProgram(bpf.OverlayProgToOverlay)
	l.nodes.from = coll.DetachProgram(bpf.OverlayProgFromOverlay)
	return nil
}

// openOverlayMap opens (or creates) the overlay object's map name pinned
// at path.
func openOverlayMap(spec *ebpf.CollectionSpec, name, path string) (*ebpf.Map, error) {
	ms := spec.Maps[name].Copy()
	ms.Pinning = ebpf.PinNone
	return openSharedMap(ms, path)
}

// setTunnelPort tells the endpoint programs the tunnel device's UDP port
// (0: none), whose traffic from pods they drop.
func setTunnelPort(b *bpfState, port int) error {
	err := b.updateNodeConfig(func(v *bpf.EndpointNodeConfigValue) { v.TunnelPort = uint32(port) })
	if err != nil {
		return fmt.Errorf("set tunnel port %d: %w", port, err)
	}
	return nil
}

// setTunnelIfindex tells the endpoint and overlay programs the tunnel
// device whose overlay programs deliver straight to the endpoints (0:
// none): from_container sends remote pods' packets straight to it.
func setTunnelIfindex(b *bpfState, ifindex int) error {
	err := b.updateNodeConfig(func(v *bpf.EndpointNodeConfigValue) { v.TunnelIfindex = uint32(ifindex) })
	if err != nil {
		return fmt.Errorf("set tunnel device %d: %w", ifindex, err)
	}
	return nil
}

// setPodCIDRs tells the endpoint programs the node's and the cluster's
// pod CIDRs (the first NODE_POD_CIDRS of cidrs; bpf/endpoint.c,
// unknown_pod).
func setPodCIDRs(b *bpfState, cidrs []netip.Prefix) error {
	err := b.updateNodeConfig(func(v *bpf.EndpointNodeConfigValue) {
		clear(v.Pods[:])
		for i, p := range cidrs[:min(len(cidrs), len(v.Pods))] {
			p = p.Masked()
			full := netip.PrefixFrom(p.Addr(), p.Bits())
			var addr, mask [16]byte
			copy(addr[:], full.Addr().AsSlice())
			for bit := range p.Bits() {
				mask[bit/8] |= 0x80 >> (bit % 8)
			}
			v.Pods[i].Addr, v.Pods[i].Mask = addrWords(addr), addrWords(mask)
			v.Pods[i].Family = familyV6
			if p.Addr().Is4() {
				v.Pods[i].Family = familyV4
			}
		}
	})
	if err != nil {
		return fmt.Errorf("set pod cidrs %v: %w", cidrs, err)
	}
	return nil
}

// updateNodeConfig changes the node_config entry with fn.
func (b *bpfState) updateNodeConfig(fn func(*bpf.EndpointNodeConfigValue)) error {
	var v bpf.EndpointNodeConfigValue
	if err := b.maps.config.Lookup(uint32(0), &v); err != nil {
		return err
	}
	fn(&v)
	return b.maps.config.Update(uint32(0), v, ebpf.UpdateAny)
}

// syncTunnelMap makes the tunnel map hold each node's pod CIDRs -> its
// tunnel address (its underlay address, IPv4 preferred), and the
// tunnel_nodes map each of its addresses -> the same: from_overlay takes
// a packet only from a node's address, for that node's pods' or own
// addresses.
func (l *Linux) syncTunnelMap(nodes []RemoteNode) error {
	cidrs := map[bpf.EndpointIpcacheKey]bpf.OverlayTunnelValue{}
	addrs := map[bpf.OverlayTunnelEndpoint]bpf.OverlayTunnelValue{}
	for _, n := range nodes {
		if len(n.Addrs) == 0 {
			continue
		}
		addr, ok := addrOfFamily(n.Addrs, true)
		if !ok {
			addr = n.Addrs[0]
		}
		v := bpf.OverlayTunnelValue{Node: overlayEndpoint(addr)}
		for _, p := range n.PodCIDRs {
			cidrs[ipcacheKey(p)] = v
		}
		for _, a := range n.Addrs {
			addrs[overlayEndpoint(a)] = v
		}
	}
	// Addresses first: a node's new pod CIDR is accepted once it is routed.
	if err := syncMap(l.nodes.tunnelNodes, addrs, "tunnel_nodes"); err != nil {
		return err
	}
	return syncMap(l.nodes.tunnel, cidrs, "tunnel")
}

// overlayEndpoint encodes a node address for the overlay maps.
func overlayEndpoint(a netip.Addr) bpf.OverlayTunnelEndpoint {
	t := tunnelEndpoint(a.Unmap())
	return bpf.OverlayTunnelEndpoint{Family: t.Family, Addr: t.Addr}
}

// syncMap makes m hold exactly want: stale keys go, the wanted ones are
// written.
func syncMap[K comparable, V any](m *ebpf.Map, want map[K]V, name string) error {
	var k K
	var v V
	var stale []K
	it := m.Iterate()
	for it.Next(&k, &v) {
		if _, ok := want[k]; !ok {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("dump %s map: %w", name, err)
	}
	for _, k := range stale {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete %s map entry %+v: %w", name, k, err)
		}
	}
	for k, v := range want {
		if err := m.Update(k, v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("update %s map entry %+v: %w", name, k, err)
		}
	}
	return nil
}

// closeNodes releases the node router's BPF objects (the pinned links
// keep the programs attached).
func (l *Linux) closeNodes() {
	l.nodes.mu.Lock()
	l.nodes.close()
	l.nodes.mu.Unlock()
}

func addrOfFamily(addrs []netip.Addr, v4 bool) (netip.Addr, bool) {
	for _, a := range addrs {
		if a.Unmap().Is4() == v4 {
			return a.Unmap(), true
		}
	}
	return netip.Addr{}, false
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func netPrefix(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	if a.Is4In6() && len(n.Mask) == net.IPv4len {
		a = a.Unmap()
	}
	return netip.PrefixFrom(a.Unmap(), ones), true
}
