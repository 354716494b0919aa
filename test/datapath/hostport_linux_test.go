package datapath_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

// hostPortMappings are a pod's hostPorts as a runtime passes them.
func hostPortMappings(tcp, udp int) map[string]any {
	return map[string]any{"portMappings": []map[string]any{
		{"hostPort": tcp, "containerPort": 8080, "protocol": "tcp"},
		{"hostPort": udp, "containerPort": 8080, "protocol": "udp"}}}
}

// askName asks the name server behind addr:port over proto from ns
// (one line over TCP, one datagram over UDP) and returns the answer.
func askName(ns *testutil.NS, proto string, addr netip.Addr, port int, timeout time.Duration) (string, error) {
	var got string
	err := ns.Do(func() error {
		c, err := net.DialTimeout(proto, netip.AddrPortFrom(addr, uint16(port)).String(), timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		if _, err := c.Write([]byte("who\n")); err != nil {
			return err
		}
		if proto == "udp" {
			buf := make([]byte, 64)
			n, err := c.Read(buf)
			got = string(buf[:n])
			return err
		}
		got, err = bufio.NewReader(c).ReadString('\n')
		got = strings.TrimSpace(got)
		return err
	})
	return got, err
}

// TestHostPortBPF is issue #35's hostPort item in kube-proxy
// replacement mode: membrane-cni declares the portMappings capability,
// the agent programs each mapping as HostPort services on the node's
// addresses (whose backend is the pod) in the BPF service maps. From
// beyond the node, nodeIP:hostPort reaches the pod over TCP and UDP,
// IPv4 and IPv6; a second pod asking for the same hostPort is refused
// with a clear error; an agent restart keeps the mapping; DEL removes it.
func TestHostPortBPF(t *testing.T) {
	e := newEnvStack(t, "10.237.0.0/24", "fd00:237::/120")
	far := farNetns(t, e.NS) // before the agent: its link is an uplink
	cg := testutil.Cgroup2Dir(t)
	kpr := func(c *agent.Config) {
		c.Linux.Services.KubeProxyReplacement, c.Linux.Services.Cgroup = true, cg
	}
	startAgent(e, kpr)
	e.Conf = e.Chain("1.0.0", nil, `"capabilities":{"portMappings":true}`, nil)
	p := e.NewPod("web")
	p.RT.CapabilityArgs = hostPortMappings(18080, 18053)
	e.MustAdd(p)
	e.DelAtCleanup(p)
	pp := &policyPod{Pod: p, ips: []netip.Addr{p.IPv4, p.IPv6}}
	pp.nameServer(t, 8080)
	nodes := []netip.Addr{netip.MustParseAddr("10.237.9.1"), netip.MustParseAddr("fd00:237:9::1")}
	reach := func(what string) {
		t.Helper()
		for _, node := range nodes {
			for _, f := range []struct {
				proto string
				port  int
			}{{"tcp", 18080}, {"udp", 18053}} {
				if got, err := askName(far.NS, f.proto, node, f.port, 5*time.Second); err != nil || got != "web" {
					t.Errorf("%s: far -> [%s]:%d/%s = %q, %v; want the pod's answer", what, node, f.port, f.proto, got, err)
				}
			}
		}
	}
	reach("after ADD")

	q := e.NewPod("web2")
	q.RT.CapabilityArgs = hostPortMappings(18080, 18054)
	if _, err := e.Add(q); err == nil || !strings.Contains(err.Error(), "taken by endpoint") {
		t.Errorf("ADD of a second pod on hostPort 18080: %v; want it refused as taken", err)
	} else {
		t.Logf("second pod on the same hostPort: %v", err)
	}
	if err := e.Del(q); err != nil {
		t.Errorf("DEL after the refused ADD: %v", err)
	}

	e.StopAgent()
	startAgent(e, kpr)
	reach("after an agent restart")

	if err := e.Del(p); err != nil {
		t.Fatal(err)
	}
	for _, node := range nodes {
		if got, err := askName(far.NS, "tcp", node, 18080, deniedDial); err == nil {
			t.Errorf("far -> [%s]:18080 answered %q after DEL", node, got)
		}
	}
	c := e.Client()
	svcs, err := c.Services(t.Context(), false)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs.Services {
		if s.Kind == "HostPort" {
			t.Errorf("HostPort service left after DEL: %+v", s)
		}
	}
}

// TestHostPortGoneWithGC: the HostPort services of a pod whose endpoint
// goes without a DEL (its netns vanished; the garbage collector deletes
// the endpoint) go with the periodic resync.
func TestHostPortGoneWithGC(t *testing.T) {
	e := newEnvStack(t, "10.237.1.0/24", "fd00:237:1::/120")
	farNetns(t, e.NS) // before the agent: its link is the uplink
	cg := testutil.Cgroup2Dir(t)
	startAgent(e, func(c *agent.Config) {
		c.Linux.Services.KubeProxyReplacement, c.Linux.Services.Cgroup = true, cg
		c.HostPortSyncInterval = 200 * time.Millisecond
	})
	e.Conf = e.Chain("1.0.0", nil, `"capabilities":{"portMappings":true}`, nil)
	p := e.NewPod("gone")
	p.RT.CapabilityArgs = hostPortMappings(18081, 18055)
	e.MustAdd(p)
	e.DelAtCleanup(p)
	c := e.Client()
	hostPorts := func() int {
		svcs, err := c.Services(t.Context(), false)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, s := range svcs.Services {
			if s.Kind == "HostPort" {
				n++
			}
		}
		return n
	}
	if hostPorts() == 0 {
		t.Fatal("no HostPort service after ADD")
	}
	if err := p.NS.Remove(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the endpoint deleted by the collector", func() bool {
		_, err := c.EndpointGet(context.Background(), "container-id:"+p.RT.ContainerID)
		return err != nil
	})
	testutil.Eventually(t, "its HostPort services gone", func() bool { return hostPorts() == 0 })
}

// TestHostPortLoopback is upstream conformance's HostPort case with
// hostIP 127.0.0.1 (Cilium's loopback HostPort): a process of the node
// (its netns, in the socket programs' cgroup, as a hostNetwork pod)
// reaches the pod at 127.0.0.1:hostPort and at [::1]:hostPort, while
// another pod connecting to its own 127.0.0.1:hostPort reaches its own
// listener: a pod's localhost is never translated. A second pod may
// take the same hostPort on the node's address (a different hostIP).
func TestHostPortLoopback(t *testing.T) {
	e := newEnvStack(t, "10.237.2.0/24", "fd00:237:2::/120")
	far := farNetns(t, e.NS)
	cg := testutil.Cgroup2Dir(t)
	startAgent(e, func(c *agent.Config) {
		c.Linux.Services.KubeProxyReplacement, c.Linux.Services.Cgroup = true, cg
	})
	e.Conf = e.Chain("1.0.0", nil, `"capabilities":{"portMappings":true}`, nil)
	const port = 18090
	lo := e.NewPod("lo")
	lo.RT.CapabilityArgs = map[string]any{"portMappings": []map[string]any{
		{"hostPort": port, "containerPort": 8080, "protocol": "tcp", "hostIP": "127.0.0.1"},
		{"hostPort": port, "containerPort": 8080, "protocol": "tcp", "hostIP": "::1"}}}
	e.MustAdd(lo)
	e.DelAtCleanup(lo)
	(&policyPod{Pod: lo, ips: []netip.Addr{lo.IPv4, lo.IPv6}}).nameServer(t, 8080)
	node := e.NewPod("node")
	node.RT.CapabilityArgs = map[string]any{"portMappings": []map[string]any{
		{"hostPort": port, "containerPort": 8080, "protocol": "tcp", "hostIP": "10.237.9.1"}}}
	e.MustAdd(node)
	e.DelAtCleanup(node)
	(&policyPod{Pod: node, ips: []netip.Addr{node.IPv4, node.IPv6}}).nameServer(t, 8080)
	other := e.NewPod("other")
	e.MustAdd(other)
	e.DelAtCleanup(other)
	for _, a := range []string{"127.0.0.1", "[::1]"} {
		var ln net.Listener
		if err := other.NS.Do(func() (err error) {
			ln, err = net.Listen("tcp", net.JoinHostPort(strings.Trim(a, "[]"), "18090"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go serveNameTCP(ln, "other-localhost")
	}
	for _, a := range []string{"127.0.0.1", "::1"} {
		if got, err := askNameInCgroup(t, e.NS, cg, a, port); err != nil || got != "lo" {
			t.Errorf("node -> [%s]:%d = %q, %v; want the pod lo's answer", a, port, got, err)
		}
		if got, err := askNameInCgroup(t, other.NS, cg, a, port); err != nil || got != "other-localhost" {
			t.Errorf("pod other -> its [%s]:%d = %q, %v; want its own listener's answer", a, port, got, err)
		}
	}
	if got, err := askName(far.NS, "tcp", netip.MustParseAddr("10.237.9.1"), port, 5*time.Second); err != nil || got != "node" {
		t.Errorf("far -> 10.237.9.1:%d = %q, %v; want the pod node's answer", port, got, err)
	}
}

// askNameInCgroup asks the name server at addr:port over TCP from a
// process started in ns and in cgroup cg (where the socket programs
// are), as a pod's or the node's process would.
func askNameInCgroup(t *testing.T, ns *testutil.NS, cg, addr string, port int) (string, error) {
	t.Helper()
	f, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	script := fmt.Sprintf("exec 3<>/dev/tcp/%s/%d && echo who >&3 && head -n1 <&3", addr, port)
	var out []byte
	err = ns.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", "-c", script)
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())}
		var err error
		out, err = cmd.CombinedOutput()
		return err
	})
	return strings.TrimSpace(string(out)), err
}

// TestHostPortNodeAddressAdded: a node address added while the agent
// runs carries the pods' hostPorts (without host-ip) at once, not at the
// next periodic resync (set to an hour here), and one removed stops.
func TestHostPortNodeAddressAdded(t *testing.T) {
	e := newEnvStack(t, "10.237.3.0/24", "fd00:237:3::/120")
	far := farNetns(t, e.NS)
	cg := testutil.Cgroup2Dir(t)
	startAgent(e, func(c *agent.Config) {
		c.Linux.Services.KubeProxyReplacement, c.Linux.Services.Cgroup = true, cg
		c.HostPortSyncInterval = time.Hour
	})
	e.Conf = e.Chain("1.0.0", nil, `"capabilities":{"portMappings":true}`, nil)
	p := e.NewPod("web")
	p.RT.CapabilityArgs = hostPortMappings(18082, 18056)
	e.MustAdd(p)
	e.DelAtCleanup(p)
	(&policyPod{Pod: p, ips: []netip.Addr{p.IPv4, p.IPv6}}).nameServer(t, 8080)
	nl := e.NS.Netlink(t)
	addrs, err := nl.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var uplink netlink.Link
	for _, a := range addrs {
		if a.IP.Equal(net.ParseIP("10.237.9.1")) {
			if uplink, err = nl.LinkByIndex(a.LinkIndex); err != nil {
				t.Fatal(err)
			}
		}
	}
	if uplink == nil {
		t.Fatal("no link holds the node address 10.237.9.1")
	}
	added := netip.MustParseAddr("10.237.9.7")
	addr, _ := netlink.ParseAddr(added.String() + "/24")
	if err := nl.AddrAdd(uplink, addr); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyErr(t, "the hostPort on the added node address", func() error {
		got, err := askName(far.NS, "tcp", added, 18082, time.Second)
		if err == nil && got != "web" {
			err = fmt.Errorf("answer %q", got)
		}
		return err
	})
	if err := nl.AddrDel(uplink, addr); err != nil {
		t.Fatal(err)
	}
	c := e.Client()
	testutil.Eventually(t, "the HostPort services on the removed address gone", func() bool {
		svcs, err := c.Services(t.Context(), false)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range svcs.Services {
			if s.Kind == "HostPort" && strings.HasPrefix(s.Frontend, added.String()+":") {
				return false
			}
		}
		return true
	})
}

// TestHostPortChained: Membrane chained after ptp (generic-veth
// chaining) with the portMappings capability maps the pod's hostPorts in
// BPF as when it makes the veth itself: from beyond the node,
// nodeIP:hostPort reaches the pod at ptp's address over TCP and UDP, and
// the chain's DEL closes them.
func TestHostPortChained(t *testing.T) {
	nodeharness.RequirePlugins(t, "ptp", "host-local")
	e := newEnvStack(t, "10.237.0.0/24", "fd00:237::/120")
	far := farNetns(t, e.NS)
	cg := testutil.Cgroup2Dir(t)
	startAgent(e, func(c *agent.Config) {
		c.Linux.Services.KubeProxyReplacement, c.Linux.Services.Cgroup = true, cg
	})
	e.Conf = e.Chain("1.0.0", []string{ptpConf(e.Dir + "/host-local")}, `"capabilities":{"portMappings":true}`, nil)
	p := e.NewPod("web")
	p.RT.CapabilityArgs = hostPortMappings(18083, 18057)
	e.MustAdd(p)
	e.DelAtCleanup(p)
	if !netip.MustParsePrefix("10.238.0.0/24").Contains(p.IPv4) {
		t.Fatalf("pod address %s, want ptp's", p.IPv4)
	}
	(&policyPod{Pod: p, ips: []netip.Addr{p.IPv4, p.IPv6}}).nameServer(t, 8080)
	nodes := []netip.Addr{netip.MustParseAddr("10.237.9.1"), netip.MustParseAddr("fd00:237:9::1")}
	for _, node := range nodes {
		for _, f := range []struct {
			proto string
			port  int
		}{{"tcp", 18083}, {"udp", 18057}} {
			if got, err := askName(far.NS, f.proto, node, f.port, 5*time.Second); err != nil || got != "web" {
				t.Errorf("far -> [%s]:%d/%s = %q, %v; want the chained pod's answer", node, f.port, f.proto, got, err)
			}
		}
	}
	if err := e.Del(p); err != nil {
		t.Fatal(err)
	}
	for _, node := range nodes {
		if got, err := askName(far.NS, "tcp", node, 18083, deniedDial); err == nil {
			t.Errorf("far -> [%s]:18083 answered %q after DEL", node, got)
		}
	}
}
