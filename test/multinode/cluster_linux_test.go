package multinode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// Addressing of a cluster: node i (0-based) has 192.168.<net>.(i+1)/24
// and fd77:<net>::(i+1)/64 on the underlay, pod ranges 10.<net>.i.0/24
// and fd91:<net>:0:i::/112; the outside host is .200 / ::200.
type cluster struct {
	t        *testing.T
	net      int // distinguishes concurrent clusters' addresses (each in its own netns anyway)
	routing  string
	dir      string
	underlay *testutil.NS
	outside  *testutil.NS
	nodes    []*node
	file     string    // the shared nodes file ("" in kvstore mode)
	etcd     *etcdProc // kvstore mode: the nodes share this etcd; nil: nodes file
	netName  string    // CNI network name of every node ("": per node)
}

// node is one Membrane node: a netns with its agent process.
type node struct {
	c            *cluster
	i            int
	name         string
	ns           *testutil.NS
	nl           *netlink.Handle // in ns
	addr4, addr6 netip.Addr
	cidr4, cidr6 netip.Prefix
	dir          string
	socket       string
	bpffs        string
	state        string
	log          string
	cmd          *exec.Cmd
	exited       chan struct{}
	cni          *libcni.CNIConfig
	conf         *libcni.NetworkConfigList
	api          *client.Client
}

// pod is a pod made by the plugin on a node.
type pod struct {
	name     string
	ns       *testutil.NS
	ip4, ip6 netip.Addr
	node     *node               // nil: not made by the plugin
	rt       *libcni.RuntimeConf // the plugin's runtime config (nil: not made by the plugin)
}

const (
	underlayMTU = 1500
	podMTU      = 1400 // fits the tunnel device's 1450
)

func (c *cluster) clusterCIDRs() string {
	return fmt.Sprintf("10.%d.0.0/16,fd91:%d::/32", c.net, c.net)
}

// newCluster makes n nodes in routing mode and starts their agents.
func newCluster(t *testing.T, routing string, n int, netNum int) *cluster {
	t.Helper()
	testutil.RequireRoot(t)
	c := &cluster{t: t, net: netNum, routing: routing, dir: t.TempDir()}
	c.file = filepath.Join(c.dir, "nodes.yaml")
	c.makeUnderlay()
	for i := range n {
		c.nodes = append(c.nodes, c.newNode(i))
	}
	c.outside = c.attach("mbm-out", 199, "eth0")
	c.writeNodesFile(c.nodes)
	c.startNodes()
	return c
}

// makeUnderlay makes the harness netns with the underlay bridge.
func (c *cluster) makeUnderlay() {
	t := c.t
	c.underlay = testutil.NewNS(t, "mbm-ul")
	unl := c.underlay.Netlink(t)
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0", MTU: underlayMTU}}
	if err := unl.LinkAdd(br); err != nil {
		t.Fatalf("underlay bridge: %v", err)
	}
	if err := unl.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
}

// startNodes starts every node's agent at once and waits until all are ready.
func (c *cluster) startNodes() {
	n := len(c.nodes)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, nd := range c.nodes {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = nd.start() }()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.t.Fatal(err)
	}
}

// attach makes a netns with a port of the underlay bridge named ifname,
// addresses .(host+1) and ::(host+1), up.
func (c *cluster) attach(prefix string, host int, ifname string) *testutil.NS {
	t := c.t
	ns := testutil.NewNS(t, prefix)
	unl := c.underlay.Netlink(t)
	peer := "ul" + testutil.RandomSuffix(8)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: peer, MTU: underlayMTU}, PeerName: "x" + peer[2:]}
	if err := unl.LinkAdd(veth); err != nil {
		t.Fatalf("underlay veth: %v", err)
	}
	br, err := unl.LinkByName("br0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := unl.LinkByName(peer)
	if err != nil {
		t.Fatal(err)
	}
	if err := unl.LinkSetMaster(l, br); err != nil {
		t.Fatal(err)
	}
	if err := unl.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	other, err := unl.LinkByName("x" + peer[2:])
	if err != nil {
		t.Fatal(err)
	}
	h, err := ns.Handle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := unl.LinkSetNsFd(other, int(h)); err != nil {
		t.Fatal(err)
	}
	nl := ns.Netlink(t)
	in, err := nl.LinkByName("x" + peer[2:])
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkSetName(in, ifname); err != nil {
		t.Fatal(err)
	}
	a4, a6 := c.underlayAddrs(host)
	for _, a := range []netip.Prefix{netip.PrefixFrom(a4, 24), netip.PrefixFrom(a6, 64)} {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), a.Addr().BitLen())}}
		if a.Addr().Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := nl.AddrAdd(in, addr); err != nil {
			t.Fatalf("address %s: %v", a, err)
		}
	}
	if err := nl.LinkSetUp(in); err != nil {
		t.Fatal(err)
	}
	return ns
}

func (c *cluster) underlayAddrs(host int) (netip.Addr, netip.Addr) {
	return netip.AddrFrom4([4]byte{192, 168, byte(c.net), byte(host + 1)}),
		netip.MustParseAddr(fmt.Sprintf("fd77:%d::%x", c.net, host+1))
}

func (c *cluster) newNode(i int) *node {
	t := c.t
	nd := &node{c: c, i: i, name: fmt.Sprintf("node-%c", 'a'+i), dir: filepath.Join(c.dir, fmt.Sprintf("node%d", i))}
	nd.ns = c.attach("mbm-node", i, "eth0")
	nd.nl = nd.ns.Netlink(t)
	nd.addr4, nd.addr6 = c.underlayAddrs(i)
	nd.cidr4 = netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", c.net, i))
	nd.cidr6 = netip.MustParsePrefix(fmt.Sprintf("fd91:%d:0:%d::/112", c.net, i))
	nd.socket, nd.state = filepath.Join(nd.dir, "agent.sock"), filepath.Join(nd.dir, "state")
	nd.bpffs, nd.log = filepath.Join(nd.dir, "bpffs"), filepath.Join(nd.dir, "agent.log")
	if err := os.MkdirAll(nd.bpffs, 0o700); err != nil {
		t.Fatal(err)
	}
	// Its own bpffs instance: pins of one node never meet another's.
	if err := unix.Mount("bpf", nd.bpffs, "bpf", 0, ""); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(nd.bpffs, unix.MNT_DETACH) })
	t.Cleanup(func() { nd.stop() }) // runs before the unmount and the netns removal
	netName := c.netName
	if netName == "" {
		netName = "mn-" + nd.name
	}
	raw := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"plugins":[{"type":"membrane-cni","socket":%q,"deleteQueueDir":%q,"mtu":%d}]}`,
		netName, nd.socket, filepath.Join(nd.dir, "delete-queue"), podMTU)
	conf, err := libcni.NetworkConfFromBytes([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	nd.conf = conf
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
	nd.cni = libcni.NewCNIConfigWithCacheDir([]string{binDir}, filepath.Join(nd.dir, "cni-cache"), exec)
	nd.api = client.New(nd.socket)
	t.Cleanup(func() { nd.api.Close() })
	return nd
}

// start starts the node's agent inside its netns and waits until ready.
func (nd *node) start() error {
	c := nd.c
	args := []string{"--socket", nd.socket, "--state-dir", nd.state, "--delete-queue-dir", filepath.Join(nd.dir, "delete-queue"),
		"--ipv4-range", nd.cidr4.String(), "--ipv6-range", nd.cidr6.String(), "--bpffs", filepath.Join(nd.bpffs, "membrane"),
		"--datapath", "linux", "--http-addr", "", "--enable-health=false", "--gc-interval", "-1s",
		"--routing", c.routing, "--masquerade", "--cluster-cidr", c.clusterCIDRs(), "--log-level", "debug"}
	if c.etcd != nil {
		args = append(args, c.etcd.agentArgs(nd)...)
	} else {
		args = append(args, "--nodes-file", c.file)
	}
	f, err := os.OpenFile(nd.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(binDir, "membrane-agent"), args...)
	cmd.Stdout, cmd.Stderr = f, f
	err = nd.ns.Do(cmd.Start) // the child inherits the thread's netns
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: start agent: %w", nd.name, err)
	}
	nd.cmd, nd.exited = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(nd.exited)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := nd.api.WaitReady(ctx, nd.exited); err != nil {
		return fmt.Errorf("%s: %w\n%s", nd.name, err, nd.tail())
	}
	return nil
}

func (nd *node) tail() string {
	data, _ := os.ReadFile(nd.log)
	if len(data) > 32<<10 {
		data = data[len(data)-32<<10:]
	}
	return string(data)
}

// stop sends SIGTERM and waits (SIGKILL after 30 s); on a failed test it
// logs the agent's log tail.
func (nd *node) stop() {
	if nd.cmd == nil {
		return
	}
	testutil.Stop(nd.cmd.Process, nd.exited, 30*time.Second)
	nd.cmd = nil
	if nd.c.t.Failed() {
		nd.c.t.Logf("%s agent log (tail):\n%s", nd.name, nd.tail())
	}
}

// kill SIGKILLs the node's agent (a crash: nothing is cleaned up) and
// waits for it to exit.
func (nd *node) kill() {
	if nd.cmd == nil {
		return
	}
	_ = nd.cmd.Process.Kill()
	<-nd.exited
	nd.cmd = nil
}

// writeNodesFile lists nodes in the shared file (YAML), atomically.
func (c *cluster) writeNodesFile(nodes []*node) {
	var b strings.Builder
	for _, nd := range nodes {
		fmt.Fprintf(&b, "- name: %s\n  addresses: [%q, %q]\n  podCIDRs: [%q, %q]\n", nd.name, nd.addr4, nd.addr6, nd.cidr4, nd.cidr6)
	}
	tmp := c.file + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		c.t.Fatal(err)
	}
	if err := os.Rename(tmp, c.file); err != nil {
		c.t.Fatal(err)
	}
}

// addPod runs the plugin's ADD for a new pod netns on nd (the plugin
// runs in the node's netns, as kubelet's would on the node), in the
// Kubernetes namespace "default".
func (nd *node) addPod(name string) *pod {
	t := nd.c.t
	t.Helper()
	p := nd.newPod(name, "default")
	if err := nd.runAdd(p); err != nil {
		t.Fatalf("%s: ADD %s: %v", nd.name, name, err)
	}
	return p
}

// newPod makes the netns of a pod in Kubernetes namespace namespace (its
// label) and registers its DEL, which runs before the netns goes
// (cleanups run last-in first-out). Safe from any goroutine.
func (nd *node) newPod(name, namespace string) *pod {
	t := nd.c.t
	p := &pod{name: name, ns: testutil.NewNS(t, "mbm-pod"), node: nd}
	p.rt = &libcni.RuntimeConf{ContainerID: "c" + testutil.RandomSuffix(16), NetNS: p.ns.Path, IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", name}}}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := nd.ns.Do(func() error { return nd.cni.DelNetworkList(ctx, nd.conf, p.rt) }); err != nil && nd.cmd != nil {
			t.Errorf("%s: DEL %s: %v", nd.name, name, err)
		}
	})
	return p
}

// runAdd runs the plugin's ADD for p once and records its addresses.
func (nd *node) runAdd(p *pod) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var res *types100.Result
	err := nd.ns.Do(func() error {
		r, err := nd.cni.AddNetworkList(ctx, nd.conf, p.rt)
		if err != nil {
			return err
		}
		res, err = types100.NewResultFromResult(r)
		return err
	})
	if err != nil {
		return err
	}
	for _, ipc := range res.IPs {
		a, _ := netip.AddrFromSlice(ipc.Address.IP)
		if a.Unmap().Is4() {
			p.ip4 = a.Unmap()
		} else {
			p.ip6 = a
		}
	}
	if !p.ip4.IsValid() || !p.ip6.IsValid() {
		return fmt.Errorf("pod %s got %v, want both families", p.name, res.IPs)
	}
	return nil
}

// runDel runs the plugin's DEL for p (kubelet's call after a failed ADD).
func (nd *node) runDel(p *pod) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return nd.ns.Do(func() error { return nd.cni.DelNetworkList(ctx, nd.conf, p.rt) })
}

// nodeRoutes returns the node's routes to other nodes' pod CIDRs (the
// datapath marks them with protocol 0x4d).
func (nd *node) nodeRoutes() (map[netip.Prefix]string, error) {
	rs, err := nd.nl.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: 0x4d}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return nil, err
	}
	out := map[netip.Prefix]string{}
	for _, r := range rs {
		if r.Dst == nil {
			continue
		}
		a, _ := netip.AddrFromSlice(r.Dst.IP)
		ones, _ := r.Dst.Mask.Size()
		via := fmt.Sprintf("dev %d", r.LinkIndex)
		if r.Gw != nil {
			via = "via " + r.Gw.String()
		}
		out[netip.PrefixFrom(a.Unmap(), ones)] = via
	}
	return out, nil
}

// tunnelIndex returns the ifindex of the node's VXLAN device (external
// mode), failing the test if it is missing or not one.
func (nd *node) tunnelIndex(t *testing.T) int {
	t.Helper()
	l, err := nd.nl.LinkByName("membrane_vxlan")
	if err != nil {
		t.Fatalf("%s: tunnel device: %v", nd.name, err)
	}
	if vx, ok := l.(*netlink.Vxlan); !ok || !vx.FlowBased || vx.Port != 8472 {
		t.Fatalf("%s: membrane_vxlan is %T %+v, want an external-mode vxlan on port 8472", nd.name, l, l)
	}
	return l.Attrs().Index
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
