package datapath

import (
	"context"
	"fmt"
	"runtime"
	"strings"

	"github.com/vishvananda/netns"

	"github.com/membrane-cni/membrane/datapath/sysctl"
)

// nsRunner runs functions on one OS thread that lives in another network
// namespace (sysctls under /proc/sys/net belong to the netns of the
// thread that opens them). The thread is never switched back: it exits
// with the goroutine.
type nsRunner struct {
	handle netns.NsHandle
	work   chan func()
	done   chan struct{}
}

func newNSRunner(path string) (*nsRunner, error) {
	h, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", path, err)
	}
	r := &nsRunner{handle: h, work: make(chan func()), done: make(chan struct{})}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := netns.Set(h); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", path, err)
			return
		}
		errc <- nil
		for {
			select {
			case fn := <-r.work:
				fn()
			case <-r.done:
				return
			}
		}
	}()
	if err := <-errc; err != nil {
		h.Close()
		return nil, err
	}
	return r, nil
}

// do runs fn in the namespace and waits for it.
func (r *nsRunner) do(ctx context.Context, fn func() error) error {
	errc := make(chan error, 1)
	select {
	case r.work <- func() { errc <- fn() }:
	case <-ctx.Done():
		return ctx.Err()
	}
	return <-errc
}

func (r *nsRunner) close() {
	close(r.done)
	r.handle.Close()
}

// hostSysctls are set on every host veth: no reverse-path filter (the
// pod's /32 route is the only route back), forwarding on (pods reach
// each other and the world through the host). Init turns forwarding on
// for the host (net.ipv4.conf.all.forwarding, i.e. ip_forward), which
// new devices inherit, so usually neither needs a write: writing
// forwarding takes the rtnl lock (retrying the syscall while another
// task holds it), which concurrent ADDs contend for.
var hostSysctls = []struct{ key, value string }{
	{"rp_filter", "0"},
	{"forwarding", "1"},
}

// hostSysctls6 are set on every host veth when the node serves IPv6:
// IPv6 on (a host whose default disables it would leave the veth
// without), and no delay before the proxied neighbour advertisements of
// the gateway (the kernel otherwise waits up to proxy_delay, 0.8 s by
// default, before answering a multicast solicitation for a proxied
// address: RFC 4861's anycast delay, pointless for the one gateway a pod
// has). IPv6 has no rp_filter: the kernel checks no return path, so
// nothing needs turning off.
var hostSysctls6 = []struct{ path, value string }{
	{"/proc/sys/net/ipv6/conf/%s/disable_ipv6", "0"},
	{"/proc/sys/net/ipv6/neigh/%s/proxy_delay", "0"},
}

// setHostSysctls makes hostSysctls (and hostSysctls6 on an IPv6 node)
// hold for dev (interface index) in the host netns, writing only values
// that differ. A new veth usually inherits them all (Init sets
// net.ipv4.conf.all.forwarding; rp_filter's default is 0), so this is
// two reads of /proc/sys. Where the host netns is not the agent's own
// (LinuxConfig.HostNetns: tests and benchmarks), /proc/sys is only
// reachable from the thread that entered it, and on an IPv4-only node
// one RTM_GETLINK through a socket in that netns reads the same values
// instead (hostSysctlsHold), sparing two hand-overs between threads;
// /proc/sys is used when it shows a value to write.
func (l *Linux) setHostSysctls(index int, dev string) error {
	if l.ns != nil && !l.cfg.hasFamily(6) {
		want := make(map[string]string, len(hostSysctls)+1)
		for _, s := range hostSysctls {
			want[s.key] = s.value
		}
		if l.cfg.L7.ProxyPath != "" {
			want["accept_local"] = "1"
		}
		if hold, err := l.hostSysctlsHold(index, dev, want); hold || err != nil {
			return err
		}
	}
	return l.inHost(func() error {
		for _, s := range hostSysctls {
			if err := ensureSysctl("/proc/sys/net/ipv4/conf/"+dev+"/"+s.key, s.value); err != nil {
				return err
			}
		}
		// With the L7 proxy, to_container hairpins redirected packets to
		// the veth's ingress, the node's own included (a host client):
		// their local source address must not make them martians.
		if l.cfg.L7.ProxyPath != "" {
			if err := ensureSysctl("/proc/sys/net/ipv4/conf/"+dev+"/accept_local", "1"); err != nil {
				return err
			}
		}
		if !l.cfg.hasFamily(6) {
			return nil
		}
		for _, s := range hostSysctls6 {
			if err := ensureSysctl(fmt.Sprintf(s.path, dev), s.value); err != nil {
				return err
			}
		}
		return nil
	})
}

// setGlobalSysctls turns on what the host needs for the families it
// serves: forwarding (pods are routed through the host) and, for IPv6,
// proxy_ndp (net.ipv6.conf.all.proxy_ndp: the host answers neighbour
// solicitations for the addresses it has proxy entries for; neighbours6
// adds one per IPv6 gateway on each host veth, nowhere else). A node
// without gateways (tests of the bare datapath) gets IPv4 forwarding.
// Note net.ipv6.conf.all.forwarding makes every interface a router, which
// stops it accepting router advertisements unless its accept_ra is 2
// (README: IPv6).
func (l *Linux) setGlobalSysctls() error {
	if l.cfg.hasFamily(4) || len(l.cfg.Gateways) == 0 {
		if err := ensureSysctl("/proc/sys/net/ipv4/conf/all/forwarding", "1"); err != nil {
			return err
		}
	}
	if l.cfg.hasFamily(6) {
		for _, p := range []string{"/proc/sys/net/ipv6/conf/all/forwarding", "/proc/sys/net/ipv6/conf/all/proxy_ndp"} {
			if err := ensureSysctl(p, "1"); err != nil {
				return err
			}
		}
	}
	return nil
}

// ensureSysctl writes value to path unless it already holds it.
func ensureSysctl(path, value string) error {
	return sysctl.Ensure(strings.TrimPrefix(path, "/proc/sys/"), value)
}

// inHost runs fn in the host netns: directly when that is the agent's
// own, else on the namespace's thread.
func (l *Linux) inHost(fn func() error) error {
	if l.ns == nil {
		return fn()
	}
	ctx, cancel := context.WithTimeout(context.Background(), sysctlTimeout)
	defer cancel()
	return l.ns.do(ctx, fn)
}
