package multinode

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
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
	// defaults starts the agents without --masquerade, --cluster-cidr
	// and --kvstore-node-addrs: masquerading is on by default and the
	// node addresses and cluster pod CIDRs are derived.
	defaults bool
	// args are added to every agent's arguments (after the harness's:
	// a repeated flag overrides).
	args []string
	// agent is the membrane-agent binary the nodes run ("": the one
	// Main built).
	agent string
	// l7 runs each agent with the L7 proxy (--l7-proxy, the node's own
	// xDS socket, listening dual-stack).
	l7 bool
	// kubeconfig runs the agents in Kubernetes mode on this kubeconfig
	// (a real kube-apiserver; the nodes from its Node objects) instead of
	// the nodes file ("": not).
	kubeconfig string
}

// node is one Membrane node: a netns on the underlay with its agent
// process.
type node struct {
	c            *cluster
	i            int
	name         string
	hn           *nodeharness.Node
	ns           *testutil.NS
	nl           *netlink.Handle // in ns
	addr4, addr6 netip.Addr
	cidr4, cidr6 netip.Prefix
	bpffs        string // the agent's pins (--bpffs), a bpffs of its own
	proc         *nodeharness.Proc
	api          *client.Client
}

// pod is a pod made by the plugin on a node.
type pod struct {
	name     string
	ns       *testutil.NS
	ip4, ip6 netip.Addr
	node     *node               // nil: not made by the plugin
	hp       *nodeharness.Pod    // the plugin's pod (nil: not made by the plugin)
	rt       *libcni.RuntimeConf // hp.RT
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
	return newClusterWith(t, routing, n, netNum, nil)
}

// newClusterWith is newCluster with args added to every agent's.
func newClusterWith(t *testing.T, routing string, n int, netNum int, args []string) *cluster {
	t.Helper()
	return newClusterAgent(t, routing, n, netNum, args, "")
}

// newClusterAgent is newClusterWith running the membrane-agent binary at
// agent ("": the one Main built), e.g. an older build for an A/B.
func newClusterAgent(t *testing.T, routing string, n int, netNum int, args []string, agent string) *cluster {
	t.Helper()
	testutil.RequireRoot(t)
	c := &cluster{t: t, net: netNum, routing: routing, dir: t.TempDir(), args: args, agent: agent}
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
	nd := &node{c: c, i: i, name: fmt.Sprintf("node-%c", 'a'+i)}
	nd.ns = c.attach("mbm-node", i, "eth0")
	nd.nl = nd.ns.Netlink(t)
	nd.addr4, nd.addr6 = c.underlayAddrs(i)
	nd.cidr4 = netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", c.net, i))
	nd.cidr6 = netip.MustParsePrefix(fmt.Sprintf("fd91:%d:0:%d::/112", c.net, i))
	netName := c.netName
	if netName == "" {
		netName = "mn-" + nd.name
	}
	// Its own bpffs instance: pins of one node never meet another's. The
	// node's cleanup stops the agent before the unmount and the netns
	// removal.
	nd.hn = nodeharness.New(t, nodeharness.Options{NS: nd.ns, Dir: filepath.Join(c.dir, fmt.Sprintf("node%d", i)),
		IPv4Range: nd.cidr4.String(), IPv6Range: nd.cidr6.String(), Network: netName, MTU: podMTU, OwnBPFFS: true})
	nd.bpffs = nd.hn.BPFFS
	nd.proc = nd.hn.Process()
	nd.api = nd.hn.Client()
	return nd
}

// start starts the node's agent inside its netns and waits until ready.
func (nd *node) start() error {
	c := nd.c
	args := []string{"--http-addr", "", "--enable-health=false", "--gc-interval", "-1s", "--routing", c.routing}
	if !c.defaults {
		args = append(args, "--masquerade", "--cluster-cidr", c.clusterCIDRs())
	}
	if c.l7 {
		args = append(args, "--l7-proxy", nodeharness.Bin("membrane-proxy"), "--l7-proxy-listen", "[::]:15001",
			"--l7-xds-socket", filepath.Join(c.dir, fmt.Sprintf("node%d", nd.i), "xds.sock"))
	}
	switch {
	case c.etcd != nil:
		args = append(args, c.etcd.agentArgs(nd)...)
	case c.kubeconfig != "":
		args = append(args, "--k8s-kubeconfig", c.kubeconfig, "--node-name", nd.name, "--identity-allocation-mode", "local",
			"--k8s-probe-interval", "1s")
	default:
		args = append(args, "--nodes-file", c.file)
	}
	args = append(args, c.args...)
	nd.proc.Args = append(nd.hn.ProcArgs(), args...)
	nd.proc.Path = c.agent
	if err := nd.proc.StartErr(); err != nil {
		return fmt.Errorf("%s: %w", nd.name, err)
	}
	return nil
}

// stop sends SIGTERM and waits (SIGKILL after 30 s); the node's cleanup
// logs the agent's log tail if the test failed.
func (nd *node) stop() { nd.proc.Stop() }

// kill SIGKILLs the node's agent (a crash: nothing is cleaned up) and
// waits for it to exit.
func (nd *node) kill() { nd.proc.Kill() }

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
	hp := nd.hn.NewPodIn(namespace, name)
	nd.hn.DelAtCleanup(hp)
	return &pod{name: name, ns: hp.NS, node: nd, hp: hp, rt: hp.RT}
}

// runAdd runs the plugin's ADD for p once and records its addresses.
func (nd *node) runAdd(p *pod) error {
	res, err := nd.hn.Add(p.hp)
	if err != nil {
		return err
	}
	p.ip4, p.ip6 = p.hp.IPv4, p.hp.IPv6
	if !p.ip4.IsValid() || !p.ip6.IsValid() {
		return fmt.Errorf("pod %s got %v, want both families", p.name, res.IPs)
	}
	return nil
}

// runDel runs the plugin's DEL for p (kubelet's call after a failed ADD).
func (nd *node) runDel(p *pod) error {
	return nd.hn.Del(p.hp)
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
