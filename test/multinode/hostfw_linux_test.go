package multinode

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

// hostFWNode is a node whose agent process runs in Kubernetes mode with
// the host firewall on: its one device (dev, holding addr) is a veth to
// an "outside" netns (holding out), through which the agent also reaches
// the API server (a forwarder in the outside netns at out:apiPort), so
// that the agent's own connection crosses the device the host policy is
// enforced on.
type hostFWNode struct {
	name    string
	node    *nodeharness.Node
	outside *testutil.NS
	// addr and out are the device's and the outside's IPv4 addresses,
	// addr6 and out6 their IPv6 ones (fd6e:<subnet's last byte>::1 and
	// ::2, a /64).
	addr, out, addr6, out6 netip.Addr
	c                      *client.Client
	// proc is the agent's process.
	proc *nodeharness.Proc
}

// probeTimeout bounds a connection attempt that policy may drop.
const hostProbeTimeout = 2 * time.Second

func newHostFWNode(t *testing.T, env *kubetest.Env, cs kubernetes.Interface, name string, nodeLabels map[string]string, podRange, subnet string, extra ...string) *hostFWNode {
	t.Helper()
	ctx := context.Background()
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: nodeLabels}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	// Dual stack: the pods' IPv6 range and the device's IPv6 subnet
	// are derived from the IPv4 ones.
	p4 := netip.MustParsePrefix(podRange).Addr().As4()
	s4 := netip.MustParseAddr(subnet + ".0").As4()
	podRange6 := fmt.Sprintf("fd6f:%d:%d::/120", p4[1], p4[2])
	h := &hostFWNode{name: name, node: nodeharness.New(t, nodeharness.Options{Prefix: "mbt-hfw", IPv4Range: podRange, IPv6Range: podRange6}),
		outside: testutil.NewNS(t, "mbt-hfwout"), addr: netip.MustParseAddr(subnet + ".1"), out: netip.MustParseAddr(subnet + ".2"),
		addr6: netip.MustParseAddr(fmt.Sprintf("fd6e:%d::1", s4[2])), out6: netip.MustParseAddr(fmt.Sprintf("fd6e:%d::2", s4[2]))}
	dev := "hfw" + testutil.RandomSuffix(4)
	oh, err := h.outside.Handle()
	if err != nil {
		t.Fatal(err)
	}
	defer oh.Close()
	nl, onl := h.node.NS.Netlink(t), h.outside.Netlink(t)
	if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: dev}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(oh))}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nl.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: dev}}) })
	for _, s := range []struct {
		h           *netlink.Handle
		link        string
		addr, addr6 netip.Addr
	}{{nl, dev, h.addr, h.addr6}, {onl, "eth0", h.out, h.out6}} {
		l, err := s.h.LinkByName(s.link)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []netip.Prefix{netip.PrefixFrom(s.addr, 24), netip.PrefixFrom(s.addr6, 64)} {
			a, err := netlink.ParseAddr(p.String())
			if err != nil {
				t.Fatal(err)
			}
			a.Flags = unix.IFA_F_NODAD
			if err := s.h.AddrAdd(l, a); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
		lo, _ := s.h.LinkByName("lo")
		_ = s.h.LinkSetUp(lo)
	}
	// The API server through the outside netns.
	u, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	forward(t, h.outside, netip.AddrPortFrom(h.out, uint16(port)), u.Host)
	kc, err := clientcmd.LoadFromFile(env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range kc.Clusters {
		c.Server = "https://" + netip.AddrPortFrom(h.out, uint16(port)).String()
		c.TLSServerName = u.Hostname() // the serving certificate's address
	}
	kcPath := filepath.Join(h.node.Dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kcPath); err != nil {
		t.Fatal(err)
	}
	args := []string{"--k8s-kubeconfig", kcPath, "--node-name", name, "--host-firewall", "--devices", dev,
		"--identity-allocation-mode", "local", "--enable-health=false", "--routing", "native", "--masquerade=false",
		"--k8s-probe-interval", "1s"}
	h.proc = h.node.Process(append(args, extra...)...)
	h.proc.Start()
	h.c = h.node.Client()
	return h
}

// forward serves a TCP forwarder at listen inside ns to target (dialled
// from the test's netns) until the test ends.
func forward(t *testing.T, ns *testutil.NS, listen netip.AddrPort, target string) {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() (err error) {
		ln, err = net.Listen("tcp", listen.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(up, c); up.Close() }()
			go func() { defer wg.Done(); _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
}

// reach reports whether a TCP echo from the outside to the node's
// IPv4 address on port works.
func (h *hostFWNode) reach(port int) bool {
	return testutil.Exchange(h.outside, h.addr, port, hostProbeTimeout) == nil
}

// reach6 is reach over IPv6.
func (h *hostFWNode) reach6(port int) bool {
	return testutil.Exchange(h.outside, h.addr6, port, hostProbeTimeout) == nil
}

// reachOut reports whether the node reaches the outside's echo on port.
func (h *hostFWNode) reachOut(port int) bool {
	return testutil.Exchange(h.node.NS, h.out, port, hostProbeTimeout) == nil
}

// hostDrops is the host endpoint's (endpoint 0) drop count of reason in
// dir.
func (h *hostFWNode) hostDrops(t *testing.T, reason, dir string) uint64 {
	t.Helper()
	ds, err := h.c.Drops(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, d := range ds {
		if d.Endpoint == datapath.HostEndpointID && d.Reason == reason && d.Direction == dir {
			n += d.Packets
		}
	}
	return n
}

func applyPolicy(t *testing.T, env *kubetest.Env, doc string) {
	t.Helper()
	objs, err := kubetest.ReadObjects([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := kubetest.Apply(ctx, env.Config, "hostfw-test", objs); err != nil {
		t.Fatal(err)
	}
}

func deletePolicy(t *testing.T, env *kubetest.Env, name string) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.RESTClient().Delete().AbsPath("/apis/membrane.io/v2/membraneclusterwidenetworkpolicies", name).Do(context.Background()).Error(); err != nil {
		t.Fatal(err)
	}
}

func relabelNode(t *testing.T, cs kubernetes.Interface, name, key, value string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, key, value)
	if _, err := cs.CoreV1().Nodes().Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitReach waits until each port's reachability from the outside is
// as wanted.
func (h *hostFWNode) waitReach(t *testing.T, what string, want map[int]bool) {
	t.Helper()
	testutil.EventuallyErr(t, what, func() error {
		for _, port := range slices.Sorted(maps.Keys(want)) {
			if got := h.reach(port); got != want[port] {
				return fmt.Errorf("outside -> %s:%d reached = %v, want %v", h.addr, port, got, want[port])
			}
		}
		return nil
	})
}

// waitReach6 is waitReach over IPv6.
func (h *hostFWNode) waitReach6(t *testing.T, what string, want map[int]bool) {
	t.Helper()
	testutil.EventuallyErr(t, what, func() error {
		for _, port := range slices.Sorted(maps.Keys(want)) {
			if got := h.reach6(port); got != want[port] {
				return fmt.Errorf("outside -> [%s]:%d reached = %v, want %v", h.addr6, port, got, want[port])
			}
		}
		return nil
	})
}

const hostAllow = `apiVersion: membrane.io/v2
kind: MembraneClusterwideNetworkPolicy
metadata: {name: hostfw-edge}
spec:
  nodeSelector: {matchLabels: {role: edge}}
  ingress:
  - fromCIDR: [%s/24, %s/64]
    toPorts: [{ports: [{port: "7001", protocol: TCP}]}]
`

// TestHostPolicy: a host policy (nodeSelector) read from the API server
// is enforced on the node's device with real traffic from outside: the
// allowed port passes, another is dropped and counted under the host
// endpoint (reason policy); a node whose labels do not match is left
// alone; deleting the policy restores access.
func TestHostPolicy(t *testing.T) {
	testutil.RequireRoot(t)
	env := kubetest.StartOwn(t)
	env.InstallCRDs(t)
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	h := newHostFWNode(t, env, cs, "hostfw-a", map[string]string{"role": "edge"}, "10.236.1.0/24", "192.168.236")
	for _, port := range []int{7001, 7002} {
		testutil.EchoServer(t, h.node.NS, h.addr, port)
		testutil.EchoServer(t, h.node.NS, h.addr6, port)
	}
	h.waitReach(t, "no host policy: everything reaches the node", map[int]bool{7001: true, 7002: true})
	h.waitReach6(t, "no host policy: everything reaches the node (IPv6)", map[int]bool{7001: true, 7002: true})

	subnet := netip.PrefixFrom(h.out, 24).Masked().Addr()
	subnet6 := netip.PrefixFrom(h.out6, 64).Masked().Addr()
	applyPolicy(t, env, fmt.Sprintf(hostAllow, subnet, subnet6))
	h.waitReach(t, "host policy: 7001 allowed, 7002 dropped", map[int]bool{7001: true, 7002: false})
	if n := h.hostDrops(t, datapath.DropPolicy, "ingress"); n == 0 {
		t.Errorf("no %s ingress drops counted under the host endpoint", datapath.DropPolicy)
	}
	before := h.hostDrops(t, datapath.DropPolicy, "ingress")
	h.waitReach6(t, "host policy (IPv6): 7001 allowed, 7002 dropped", map[int]bool{7001: true, 7002: false})
	if n := h.hostDrops(t, datapath.DropPolicy, "ingress"); n <= before {
		t.Errorf("no IPv6 %s ingress drops counted under the host endpoint (%d, before %d)", datapath.DropPolicy, n, before)
	}

	// The node's labels no longer match: unaffected.
	relabelNode(t, cs, h.name, "role", "core")
	h.waitReach(t, "node role=core: not selected", map[int]bool{7001: true, 7002: true})
	relabelNode(t, cs, h.name, "role", "edge")
	h.waitReach(t, "node role=edge again: selected", map[int]bool{7001: true, 7002: false})

	deletePolicy(t, env, "hostfw-edge")
	h.waitReach(t, "policy deleted: access restored", map[int]bool{7001: true, 7002: true})
}

// TestHostPolicySafetyNet: a host policy denying everything, both ways,
// cuts the node off the outside but not the agent off the API server,
// whose connection crosses the same device: the agent still sees the
// policy's deletion, and access comes back.
func TestHostPolicySafetyNet(t *testing.T) {
	testutil.RequireRoot(t)
	env := kubetest.StartOwn(t)
	env.InstallCRDs(t)
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	h := newHostFWNode(t, env, cs, "hostfw-b", map[string]string{"role": "any"}, "10.236.2.0/24", "192.168.237")
	// The safety net follows the API server's own EndpointSlice
	// (default/kubernetes; this API server writes none, the test does).
	tcp := corev1.ProtocolTCP
	sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kubernetes"},
		AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.50"}}},
		Ports: []discoveryv1.EndpointPort{{Port: ptrTo[int32](6443), Protocol: &tcp}}}
	if sl, err = cs.DiscoveryV1().EndpointSlices("default").Create(context.Background(), sl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.DiscoveryV1().EndpointSlices("default").Delete(context.Background(), "kubernetes", metav1.DeleteOptions{})
	})
	h.waitSafe(t, "the API server's EndpointSlice", []string{"192.0.2.50:6443"}, nil)
	sl.Endpoints[0].Addresses = []string{"192.0.2.51"}
	sl.Ports[0].Port = ptrTo[int32](7443)
	if _, err = cs.DiscoveryV1().EndpointSlices("default").Update(context.Background(), sl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitSafe(t, "the API server's EndpointSlice changed", []string{"192.0.2.51:7443"}, []string{"192.0.2.50:6443"})
	testutil.EchoServer(t, h.node.NS, h.addr, 7001)
	testutil.EchoServer(t, h.outside, h.out, 7003)
	h.waitReach(t, "no host policy", map[int]bool{7001: true})
	if !h.reachOut(7003) {
		t.Fatal("the node does not reach the outside without a host policy")
	}
	applyPolicy(t, env, `apiVersion: membrane.io/v2
kind: MembraneClusterwideNetworkPolicy
metadata: {name: hostfw-deny-all}
spec:
  nodeSelector: {}
  ingress: []
  egress: []
`)
	h.waitReach(t, "deny all: nothing reaches the node", map[int]bool{7001: false})
	testutil.Eventually(t, "deny all: the node reaches nothing outside", func() bool { return !h.reachOut(7003) })
	if n := h.hostDrops(t, datapath.DropPolicy, "egress"); n == 0 {
		t.Errorf("no %s egress drops counted under the host endpoint", datapath.DropPolicy)
	}
	// The agent's watch still works: it sees the deletion.
	deletePolicy(t, env, "hostfw-deny-all")
	h.waitReach(t, "policy deleted (seen through the API server connection): access restored", map[int]bool{7001: true})
	testutil.Eventually(t, "the node reaches the outside again", func() bool { return h.reachOut(7003) })
}

const hostDenyOutside = `apiVersion: membrane.io/v2
kind: MembraneClusterwideNetworkPolicy
metadata: {name: hostfw-no-outside}
spec:
  nodeSelector: {}
  ingress: []
  egress: []
`

const podAllowOutside = `apiVersion: membrane.io/v2
kind: MembraneNetworkPolicy
metadata: {name: pod-to-outside, namespace: default}
spec:
  endpointSelector: {}
  egress:
  - toCIDR: [%s/24]
`

// TestHostPolicyMasquerade: with masquerading on, a pod's traffic to the
// outside leaves through the node's device with the node's address as
// source (nftables SNAT before the device's egress program). A host
// policy denying the outside drops the node's own connection but not
// the pod's, which its own egress policy allows; the pod's replies pass
// the device's ingress although the host policy denies all ingress.
func TestHostPolicyMasquerade(t *testing.T) {
	testutil.RequireRoot(t)
	env := kubetest.StartOwn(t)
	env.InstallCRDs(t)
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	h := newHostFWNode(t, env, cs, "hostfw-c", map[string]string{"role": "any"}, "10.236.3.0/24", "192.168.238",
		"--masquerade=true", "--cluster-cidr", "10.236.0.0/16")
	testutil.EchoServer(t, h.outside, h.out, 7004)
	pod := h.node.AddPod("masq")
	podReachOut := func() bool { return testutil.Exchange(pod.NS, h.out, 7004, hostProbeTimeout) == nil }
	testutil.Eventually(t, "no policy: the node reaches the outside", func() bool { return h.reachOut(7004) })
	testutil.Eventually(t, "no policy: the pod reaches the outside", podReachOut)

	subnet := netip.PrefixFrom(h.out, 24).Masked().Addr()
	applyPolicy(t, env, fmt.Sprintf(podAllowOutside, subnet))
	applyPolicy(t, env, hostDenyOutside)
	testutil.Eventually(t, "host denies all: the node reaches nothing outside", func() bool { return !h.reachOut(7004) })
	if n := h.hostDrops(t, datapath.DropPolicy, "egress"); n == 0 {
		t.Errorf("no %s egress drops counted under the host endpoint", datapath.DropPolicy)
	}
	// The pod's egress policy decides on its masqueraded traffic, and
	// its replies pass the host's ingress. Several connections: each a
	// new masqueraded flow through the device.
	for i := range 3 {
		if err := testutil.Exchange(pod.NS, h.out, 7004, hostProbeTimeout); err != nil {
			t.Fatalf("pod -> outside (masqueraded) #%d under a host policy denying the outside: %v", i, err)
		}
	}
	if h.reachOut(7004) {
		t.Error("the node reaches the outside again after the pod's connections")
	}
}

// hostSafePeers reads the pinned host_safe map as "addr:port" strings.
func hostSafePeers(pin string) ([]string, error) {
	m, err := ebpf.LoadPinnedMap(pin, &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	var out []string
	var k bpf.EndpointHostSafeKey
	var v uint32
	it := m.Iterate()
	for it.Next(&k, &v) {
		var b [16]byte
		for i, w := range k.Addr {
			binary.NativeEndian.PutUint32(b[4*i:], w)
		}
		a := netip.AddrFrom16(b)
		if k.Family == 4 {
			a = netip.AddrFrom4([4]byte(b[:4]))
		}
		port := k.Port>>8 | k.Port<<8 // network byte order
		out = append(out, netip.AddrPortFrom(a, port).String())
	}
	return out, it.Err()
}

func ptrTo[T any](v T) *T { return &v }

// waitSafe waits until the node's host_safe map holds each of want and
// none of gone ("addr:port").
func (h *hostFWNode) waitSafe(t *testing.T, what string, want, gone []string) {
	t.Helper()
	testutil.EventuallyErr(t, "host_safe follows "+what, func() error {
		have, err := hostSafePeers(filepath.Join(h.node.BPFFS, "host_safe"))
		if err != nil {
			return err
		}
		for _, p := range want {
			if !slices.Contains(have, p) {
				return fmt.Errorf("host_safe holds %v, not %s", have, p)
			}
		}
		for _, p := range gone {
			if slices.Contains(have, p) {
				return fmt.Errorf("host_safe holds %v, still %s", have, p)
			}
		}
		return nil
	})
}
