package datapath

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/bpf"
)

// Pins of the kube-proxy-free mode's links under BPFFS: one per socket
// program (by attach point) and one per uplink (by device name).
const (
	pinSockDir   = "socklb"
	pinNetdevDir = "netdev"
)

// sockHooks are the socket programs and where they attach.
var sockHooks = []struct {
	name, prog string
	attach     ebpf.AttachType
}{
	{"connect4", bpf.SockProgSockConnect4, ebpf.AttachCGroupInet4Connect},
	{"sendmsg4", bpf.SockProgSockSendmsg4, ebpf.AttachCGroupUDP4Sendmsg},
	{"recvmsg4", bpf.SockProgSockRecvmsg4, ebpf.AttachCGroupUDP4Recvmsg},
	{"getpeername4", bpf.SockProgSockGetpeername4, ebpf.AttachCgroupInet4GetPeername},
	{"connect6", bpf.SockProgSockConnect6, ebpf.AttachCGroupInet6Connect},
	{"sendmsg6", bpf.SockProgSockSendmsg6, ebpf.AttachCGroupUDP6Sendmsg},
	{"recvmsg6", bpf.SockProgSockRecvmsg6, ebpf.AttachCGroupUDP6Recvmsg},
	{"getpeername6", bpf.SockProgSockGetpeername6, ebpf.AttachCgroupInet6GetPeername},
}

// kprState is what initKPR attached, for DumpServices.
type kprState struct {
	// mu guards hooks.
	mu    sync.Mutex
	hooks ServiceHooks
}

func (l *Linux) serviceHooks() ServiceHooks {
	l.kpr.mu.Lock()
	defer l.kpr.mu.Unlock()
	h := l.kpr.hooks
	h.SocketPrograms, h.Devices = slices.Clone(h.SocketPrograms), slices.Clone(h.Devices)
	return h
}

// initKPR attaches the socket programs to the configured cgroup and
// from_netdev to the uplinks in the kube-proxy-free mode; otherwise it
// detaches what an earlier agent (run in that mode) left pinned, so
// kube-proxy is the only one translating those paths. from_netdev also
// runs on the uplinks in native routing, where it delivers other nodes'
// pod traffic straight to the endpoints (bpf/endpoint.c,
// netdev_deliver); node_config's netdev_flags say whether it translates
// NodePorts and runs the host firewall too.
func (l *Linux) initKPR() error {
	c := l.cfg.Services
	var h ServiceHooks
	hf := l.cfg.HostFirewall.Enabled
	native := l.cfg.Nodes.Routing == RoutingNative
	var uplinks []string // native routing's, once from_netdev is on them
	err := l.guardBPF(func(b *bpfState) error {
		// No pod's packet goes straight to an uplink whose from_netdev
		// may go below (those not among the devices now).
		devs, derr := l.devices()
		if err := l.keepUplinks(b, devs); err != nil {
			return err
		}
		if err := setNetdevServices(b, c.KubeProxyReplacement || hf); err != nil {
			return err
		}
		if !c.KubeProxyReplacement {
			if err := l.detachKPR(b, hf || (native && derr == nil)); err != nil {
				return err
			}
			if !hf {
				if err := l.detachHostFirewall(b); err != nil {
					return err
				}
				if !native {
					return nil
				}
				if derr != nil {
					l.log.Warn("native routing: no uplink found; pods' traffic to other nodes crosses the stack", "err", derr)
					return nil
				}
				h.Devices, uplinks = devs, devs
				return l.attachNetdev(b, devs, false)
			}
			if derr != nil {
				return derr
			}
			h.Devices = devs
			if native {
				uplinks = devs
			}
			return l.attachHostFirewall(b, devs, false)
		}
		h.KubeProxyReplacement = true
		cg := c.Cgroup
		if cg == "" {
			root, err := cgroup2Root()
			if err != nil {
				return err
			}
			cg = root
		}
		cookie, err := l.hostNetnsCookie()
		if err != nil {
			return err
		}
		if err := attachSocketLB(b, cg, cookie); err != nil {
			return err
		}
		h.Cgroup = cg
		for _, s := range sockHooks {
			h.SocketPrograms = append(h.SocketPrograms, s.name)
		}
		if derr != nil {
			return derr
		}
		h.Devices = devs
		if native {
			uplinks = devs
		}
		if hf {
			return l.attachHostFirewall(b, devs, true)
		}
		if err := l.detachHostFirewall(b); err != nil {
			return err
		}
		return l.attachNetdev(b, devs, true)
	})
	if err == nil && uplinks != nil {
		// from_netdev is on them: from_container may send there.
		err = l.guardBPF(func(b *bpfState) error { return l.setUplinks(b, uplinks) })
	}
	if err != nil {
		return fmt.Errorf("kube-proxy replacement: %w", err)
	}
	l.kpr.mu.Lock()
	l.kpr.hooks = h
	l.kpr.mu.Unlock()
	if h.KubeProxyReplacement {
		l.log.Info("kube-proxy replacement attached", "cgroup", h.Cgroup, "devices", h.Devices)
	}
	if uplinks != nil {
		l.log.Info("native routing: direct delivery on the uplinks", "devices", uplinks)
	}
	return nil
}

// setNetdevServices tells from_netdev whether it translates NodePorts
// and runs the host firewall, which it does in the kube-proxy-free mode
// or with the host firewall; without either it only delivers native
// routing's traffic (node_config NETDEV_F_DELIVER_ONLY).
func setNetdevServices(b *bpfState, on bool) error {
	err := b.updateNodeConfig(func(v *bpf.EndpointNodeConfigValue) {
		v.NetdevFlags &^= netdevFlagDeliverOnly
		if !on {
			v.NetdevFlags |= netdevFlagDeliverOnly
		}
	})
	if err != nil {
		return fmt.Errorf("set uplink program flags: %w", err)
	}
	return nil
}

// bpf/endpoint.h's NETDEV_F_DELIVER_ONLY.
const netdevFlagDeliverOnly = 1

// setUplinks tells the endpoint programs the uplinks whose from_netdev
// delivers straight to the endpoints (node_config.uplinks: the first
// len(Uplinks) of devs, those holding a default route first, by
// ifindex; none for nil). from_container then sends remote pods'
// packets routed out of them straight there.
func (l *Linux) setUplinks(b *bpfState, devs []string) error {
	type uplink struct {
		name  string
		index uint32
	}
	var ups []uplink
	for _, d := range devs {
		dev, err := l.nl.LinkByName(d)
		if err != nil {
			return fmt.Errorf("uplink %s: %w", d, err)
		}
		ups = append(ups, uplink{d, uint32(dev.Attrs().Index)})
	}
	var v bpf.EndpointNodeConfigValue
	if n := len(v.Uplinks); len(ups) > n {
		def := l.defaultRouteLinks()
		slices.SortStableFunc(ups, func(a, b uplink) int {
			return cmp.Compare(b2i(def[b.index]), b2i(def[a.index]))
		})
		name := func(u uplink) string { return u.name }
		l.log.Warn("native routing: direct delivery on the first uplinks only (those of the default route first)",
			"devices", mapSlice(ups[:n], name), "through the stack", mapSlice(ups[n:], name))
		ups = ups[:n]
	}
	err := b.updateNodeConfig(func(v *bpf.EndpointNodeConfigValue) {
		clear(v.Uplinks[:])
		for i, u := range ups {
			v.Uplinks[i] = u.index
		}
	})
	if err != nil {
		return fmt.Errorf("set uplinks %v: %w", devs, err)
	}
	return nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func mapSlice[T, U any](s []T, f func(T) U) []U {
	out := make([]U, 0, len(s))
	for _, v := range s {
		out = append(out, f(v))
	}
	return out
}

// defaultRouteLinks are the ifindexes of the devices holding a default
// route of the host netns's main table (either family; none when the
// routes cannot be read).
func (l *Linux) defaultRouteLinks() map[uint32]bool {
	out := map[uint32]bool{}
	rs, err := l.nl.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return out
	}
	for _, r := range rs {
		if r.Dst != nil {
			if ones, _ := r.Dst.Mask.Size(); ones != 0 {
				continue
			}
		}
		out[uint32(r.LinkIndex)] = true
		for _, nh := range r.MultiPath {
			out[uint32(nh.LinkIndex)] = true
		}
	}
	return out
}

// keepUplinks removes from node_config.uplinks every uplink not among
// devs (by ifindex; all of them when devs is nil or native routing is
// off), before their from_netdev may be detached.
func (l *Linux) keepUplinks(b *bpfState, devs []string) error {
	keep := map[uint32]bool{}
	if l.cfg.Nodes.Routing == RoutingNative {
		for _, d := range devs {
			if dev, err := l.nl.LinkByName(d); err == nil {
				keep[uint32(dev.Attrs().Index)] = true
			}
		}
	}
	err := b.updateNodeConfig(func(v *bpf.EndpointNodeConfigValue) {
		for i, ix := range v.Uplinks {
			if !keep[ix] {
				v.Uplinks[i] = 0
			}
		}
	})
	if err != nil {
		return fmt.Errorf("set uplinks: %w", err)
	}
	return nil
}

// cgroup2Root is the mount point of the cgroup2 hierarchy (the unified
// one on a hybrid host), from /proc/self/mountinfo.
func cgroup2Root() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("find cgroup2 mount: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "... mountpoint ... - fstype source options"
		fields := strings.Fields(sc.Text())
		i := slices.Index(fields, "-")
		if i > 4 && i+1 < len(fields) && fields[i+1] == "cgroup2" {
			return fields[4], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("find cgroup2 mount: %w", err)
	}
	return "", fmt.Errorf("find cgroup2 mount: none mounted: %w", ErrInvalidConfig)
}

// hostNetnsCookie is the node's network namespace cookie (the host
// netns the datapath works in), which the socket programs compare a
// socket's with for loopback frontends.
func (l *Linux) hostNetnsCookie() (uint64, error) {
	var cookie uint64
	get := func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		return err
	}
	var err error
	if l.ns != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err = l.ns.do(ctx, get)
	} else {
		err = get()
	}
	if err != nil {
		return 0, fmt.Errorf("the node's netns cookie (SO_NETNS_COOKIE, Linux 5.14): %w", err)
	}
	return cookie, nil
}

// attachSocketLB loads the socket programs with the shared service maps
// and the node's netns cookie, and attaches them to cgroup dir cg
// (pinned links, updated in place when they already hold that cgroup, so
// translation never stops).
func attachSocketLB(b *bpfState, cg string, hostCookie uint64) error {
	spec, err := bpf.LoadSock()
	if err != nil {
		return fmt.Errorf("parse socket object: %w", err)
	}
	if v := spec.Variables[bpf.SockVarHostNetnsCookie]; v == nil {
		return fmt.Errorf("socket object: no variable %s", bpf.SockVarHostNetnsCookie)
	} else if err := v.Set(hostCookie); err != nil {
		return fmt.Errorf("socket object: set %s: %w", bpf.SockVarHostNetnsCookie, err)
	}
	repl := map[string]*ebpf.Map{}
	for _, m := range b.maps.lb.named() {
		repl[m.name] = *m.dst
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: repl, Cache: b.tmpl.cache})
	if err != nil {
		return fmt.Errorf("load socket programs: %w", err)
	}
	defer coll.Close()
	var st unix.Stat_t
	if err := unix.Stat(cg, &st); err != nil {
		return fmt.Errorf("cgroup %s: %w", cg, err)
	}
	dir := filepath.Join(b.dir, pinSockDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	for _, s := range sockHooks {
		path := filepath.Join(dir, s.name)
		lk, err := attachCgroup(path, cg, st.Ino, s.attach, coll.Programs[s.prog])
		if err != nil {
			return err
		}
		b.holdLink(path, lk)
	}
	return nil
}

// attachCgroup makes the link pinned at path run prog at attach on the
// cgroup cg (inode ino), and returns it open (the caller holds it).
func attachCgroup(path, cg string, ino uint64, attach ebpf.AttachType, prog *ebpf.Program) (link.Link, error) {
	if lk, err := link.LoadPinnedLink(path, nil); err == nil {
		info, ierr := lk.Info()
		same := ierr == nil && info.Cgroup() != nil && info.Cgroup().CgroupId == ino
		if same && lk.Update(prog) == nil {
			return lk, nil
		}
		_ = lk.Unpin()
		lk.Close()
	} else if !errors.Is(err, os.ErrNotExist) {
		if err := unpin(path); err != nil {
			return nil, err
		}
	}
	lk, err := link.AttachCgroup(link.CgroupOptions{Path: cg, Attach: attach, Program: prog})
	if err != nil {
		return nil, fmt.Errorf("attach %s to cgroup %s: %w", attach, cg, err)
	}
	if err := lk.Pin(path); err != nil {
		lk.Close()
		return nil, fmt.Errorf("pin %s: %w", path, err)
	}
	return lk, nil
}

// hookNetdev is from_netdev's attach point on an uplink.
func hookNetdev(dev string) hook {
	return hook{pin: dev, tcx: ebpf.AttachTCXIngress, parent: netlink.HANDLE_MIN_INGRESS, name: "membrane-netdev"}
}

// devices are the configured uplinks, or the detected ones.
func (l *Linux) devices() ([]string, error) {
	if devs := l.cfg.Services.Devices; len(devs) > 0 {
		return devs, nil
	}
	return l.detectDevices()
}

// attachNetdev loads from_netdev with the shared maps and attaches it at
// ingress of each device (with kpr, nodeport_reply into the endpoints'
// tail-call slot); pins of devices no longer listed are removed.
func (l *Linux) attachNetdev(b *bpfState, devs []string, kpr bool) error {
	progs, err := loadNetdevFor(b, kpr)
	if err != nil {
		return err
	}
	defer progs.close()
	return l.attachDevices(b, pinNetdevDir, hookNetdev, devs, progs.from)
}

// loadNetdevFor is loadNetdev that, with kpr, also installs
// nodeport_reply into the endpoints' tail-call slot.
func loadNetdevFor(b *bpfState, kpr bool) (netdevPrograms, error) {
	progs, err := loadNetdev(b)
	if err != nil || !kpr {
		return progs, err
	}
	if err := b.maps.lb.progs.Update(uint32(0), progs.reply, ebpf.UpdateAny); err != nil {
		progs.close()
		return netdevPrograms{}, fmt.Errorf("install nodeport_reply: %w", err)
	}
	return progs, nil
}

// attachDevices attaches prog at hook h of each device, pinned under
// <bpffs>/dir; pins of devices no longer listed are removed.
func (l *Linux) attachDevices(b *bpfState, dir string, h func(string) hook, devs []string, prog *ebpf.Program) error {
	dir = filepath.Join(b.dir, dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	for _, d := range devs {
		dev, err := l.nl.LinkByName(d)
		if err != nil {
			return fmt.Errorf("uplink %s: %w", d, err)
		}
		if err := l.attachDevice(b, dir, h(d), dev.Attrs().Index, prog); err != nil {
			return err
		}
	}
	return l.prunePins(b, dir, devs)
}

// netdevPrograms are the uplinks' programs.
type netdevPrograms struct {
	from, to, reply *ebpf.Program
}

func (p netdevPrograms) close() {
	for _, pr := range []*ebpf.Program{p.from, p.to, p.reply} {
		if pr != nil {
			pr.Close()
		}
	}
}

// loadNetdev loads from_netdev, to_netdev and nodeport_reply (the tail
// call of the endpoints' from-container) from the endpoint object, with
// the shared maps.
func loadNetdev(b *bpfState) (netdevPrograms, error) {
	spec := b.tmpl.spec.Copy()
	for name := range spec.Programs {
		if name != bpf.EndpointProgFromNetdev && name != bpf.EndpointProgToNetdev && name != bpf.EndpointProgNodeportReply {
			delete(spec.Programs, name)
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: b.maps.replacements(), Cache: b.tmpl.cache})
	if err != nil {
		return netdevPrograms{}, fmt.Errorf("load uplink program: %w", err)
	}
	defer coll.Close()
	return netdevPrograms{from: coll.DetachProgram(bpf.EndpointProgFromNetdev), to: coll.DetachProgram(bpf.EndpointProgToNetdev),
		reply: coll.DetachProgram(bpf.EndpointProgNodeportReply)}, nil
}

// prunePins detaches the links pinned in dir not named in keep (unpins
// them and releases the agent's own reference).
func (l *Linux) prunePins(b *bpfState, dir string, keep []string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	for _, e := range ents {
		if !slices.Contains(keep, e.Name()) {
			if err := unpin(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
			b.releaseLink(filepath.Join(dir, e.Name()))
		}
	}
	return nil
}

// detachKPR removes the socket and uplink links a previous agent in the
// kube-proxy-free mode pinned (unpinning the last reference detaches),
// the legacy filters of the configured devices and nodeport_reply from
// the endpoints' tail-call slot.
func (l *Linux) detachKPR(b *bpfState, keepNetdev bool) error {
	if err := b.maps.lb.progs.Delete(uint32(0)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("remove nodeport_reply: %w", err)
	}
	dirs := []string{pinSockDir, pinNetdevDir}
	if keepNetdev {
		dirs = dirs[:1] // the host firewall's
	}
	for _, d := range dirs {
		if err := l.prunePins(b, filepath.Join(b.dir, d), nil); err != nil {
			return err
		}
		b.releaseLinksUnder(filepath.Join(b.dir, d))
	}
	if !b.devLegacy || keepNetdev {
		return nil
	}
	for _, d := range l.cfg.Services.Devices {
		if dev, err := l.nl.LinkByName(d); err == nil {
			if err := detachLegacy(l.nl, hookNetdev(d), dev.Attrs().Index); err != nil {
				return err
			}
		}
	}
	return nil
}

// detectDevices are the host netns's up devices holding a global unicast
// address (the node's addresses), except the gateway and tunnel devices.
func (l *Linux) detectDevices() ([]string, error) {
	links, err := l.nl.LinkList()
	if err != nil {
		return nil, fmt.Errorf("detect uplinks: %w", err)
	}
	var out []string
	for _, lk := range links {
		a := lk.Attrs()
		if a.Flags&net.FlagUp == 0 || a.Flags&net.FlagLoopback != 0 ||
			a.Name == l.cfg.GatewayDevice || a.Name == l.cfg.Nodes.TunnelDevice {
			continue
		}
		addrs, err := l.nl.AddrList(lk, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("detect uplinks: addresses of %s: %w", a.Name, err)
		}
		if slices.ContainsFunc(addrs, func(ad netlink.Addr) bool { return ad.IP.IsGlobalUnicast() }) {
			out = append(out, a.Name)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("detect uplinks: no device holds a node address; set the devices: %w", ErrInvalidConfig)
	}
	return out, nil
}
