package multinode

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// tunnelPolicyDoc lets only the host and app=friend reach app=target on
// UDP 9000.
const tunnelPolicyDoc = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: tunnel-target
  namespace: default
spec:
  endpointSelector:
    matchLabels:
      app: target
  ingress:
  - fromEntities: [host]
    toPorts:
    - ports: [{port: "9000", protocol: UDP}]
  - fromEndpoints:
    - matchLabels:
        app: friend
    toPorts:
    - ports: [{port: "9000", protocol: UDP}]
`

const (
	tunnelPort = 8472 // the nodes' VXLAN port (the agent's default)
	targetPort = 9000
	hostID     = 1 // reserved:host
)

// TestTunnelForgery (issue 32, item 1): in tunnel mode the receiving
// node takes the VNI as the source identity, so nobody but a known node
// may choose it. Two nodes (and a third, "ghost", listed in the nodes
// file with its pod CIDRs but never started); on each node a target pod
// (app=target) whose ingress admits only the host and app=friend (a
// pod on the same node) on UDP 9000, and a UDP listener in it; an
// attacker pod on A. Each case sends a
// real VXLAN datagram (a UDP socket writing the VXLAN header and an
// inner Ethernet/IP/UDP frame to the target) to a node address on 8472,
// over IPv4 and over IPv6 (inner and outer of one family):
//   - pod-vni-host, pod-vni-friend: a pod on A sends it to B's address
//     (the node masquerades it to A's address, a real node's): A's
//     endpoint program drops it as tunnel-port under the pod's endpoint;
//   - pod-own-node: the same pod sends it to its own node's address, for
//     a target on A (with the same policy): tunnel-port;
//   - outsider: a host on the underlay that is no node: B's overlay
//     program drops it as tunnel-unknown-node;
//   - node-vni-host: node A itself with VNI 1 (host), which to_overlay
//     never sends: tunnel-reserved-identity;
//   - node-foreign-source: node A with an inner source of the ghost
//     node's pod CIDR: tunnel-invalid-source.
//
// Each must be counted by the node that drops it and never reach the
// target (a datagram from app=friend sent after the drop arrives alone;
// the forged one arriving first fails the case at once, as it does
// before the fix). The control node-legit: node A forging app=friend's
// number for its own pod's address is delivered: the frames are well
// formed, and a node's root can choose the identity of its own pods'
// traffic (only encryption with node authentication would stop an
// underlay host doing so from A's address).
func TestTunnelForgery(t *testing.T) {
	c := newCluster(t, "tunnel", 2, 87)
	a, b := c.nodes[0], c.nodes[1]
	ghost := c.ghostNode(2)
	c.writeNodesFile(append(slices.Clone(c.nodes), ghost))
	waitRoutes(t, a, b)
	testutil.EventuallyErr(t, b.name+"'s route to the ghost node's pods", func() error { return routedTo(b, ghost) })
	attacker := a.addPod("attacker")
	va, vb := newVictim(t, a), newVictim(t, b)
	attackerEP := endpointOf(t, attacker).ID
	for _, v6 := range []bool{false, true} {
		fam := map[bool]string{false: "ipv4", true: "ipv6"}[v6]
		pick := func(x4, x6 netip.Addr) netip.Addr { return map[bool]netip.Addr{false: x4, true: x6}[v6] }
		own, foreign := pick(attacker.ip4, attacker.ip6), pick(ghost.cidr4.Addr().Next(), ghost.cidr6.Addr().Next())
		cases := []forgery{
			{name: "pod-vni-host", from: attacker.ns, v: vb, vni: hostID, src: own,
				dropAt: a, ep: attackerEP, reason: "tunnel-port", dir: "egress"},
			{name: "pod-vni-friend", from: attacker.ns, v: vb, vni: vb.friendID, src: own,
				dropAt: a, ep: attackerEP, reason: "tunnel-port", dir: "egress"},
			{name: "pod-own-node", from: attacker.ns, v: va, vni: va.friendID, src: own,
				dropAt: a, ep: attackerEP, reason: "tunnel-port", dir: "egress"},
			{name: "outsider", from: c.outside, v: vb, vni: vb.friendID, src: own,
				dropAt: b, reason: "tunnel-unknown-node", dir: "ingress"},
			{name: "node-vni-host", from: a.ns, v: vb, vni: hostID, src: own,
				dropAt: b, reason: "tunnel-reserved-identity", dir: "ingress"},
			{name: "node-foreign-source", from: a.ns, v: vb, vni: vb.friendID, src: foreign,
				dropAt: b, reason: "tunnel-invalid-source", dir: "ingress"},
		}
		for _, f := range cases {
			f.to, f.dst = pick(f.v.node.addr4, f.v.node.addr6), pick(f.v.target.ip4, f.v.target.ip6)
			t.Run(f.name+"-"+fam, func(t *testing.T) { f.mustDrop(t) })
		}
		t.Run("node-legit-"+fam, func(t *testing.T) {
			f := forgery{from: a.ns, to: pick(b.addr4, b.addr6), vni: vb.friendID, src: own, dst: pick(vb.target.ip4, vb.target.ip6)}
			payload := f.send(t)
			testutil.EventuallyErr(t, payload+" at the target", func() error { return vb.sink.has(payload) })
		})
	}
}

// victim is a node's target pod (app=target, admitting only the host
// and app=friend on UDP 9000, a listener on that port) and its friend.
type victim struct {
	node           *node
	target, friend *pod
	friendID       uint32 // app=friend's identity on node (its own numbering)
	sink           *sink
}

// newVictim makes nd's target and friend, imports the policy on nd and
// waits until the target's policy map admits the host and the friend.
func newVictim(t *testing.T, nd *node) *victim {
	t.Helper()
	v := &victim{node: nd, target: nd.addPod("target"), friend: nd.addPod("friend")}
	labelPod(t, v.target, "k8s:app=target")
	v.friendID = uint32(labelPod(t, v.friend, "k8s:app=friend").Identity.ID)
	rev := importPolicy(t, nd, tunnelPolicyDoc, "tunnel-target")
	testutil.EventuallyErr(t, nd.name+"'s target admitting host and app=friend", func() error {
		return admits(v.target, rev, []uint32{hostID, v.friendID}, targetPort)
	})
	v.sink = listenSink(t, v.target, targetPort)
	return v
}

// ghostNode is a node of c's addressing (index i) that is listed in the
// nodes file but never started.
func (c *cluster) ghostNode(i int) *node {
	nd := &node{c: c, i: i, name: fmt.Sprintf("node-%c", 'a'+i)}
	nd.addr4, nd.addr6 = c.underlayAddrs(i)
	nd.cidr4 = netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", c.net, i))
	nd.cidr6 = netip.MustParsePrefix(fmt.Sprintf("fd91:%d:0:%d::/112", c.net, i))
	return nd
}

// routedTo reports whether nd routes o's pod CIDRs.
func routedTo(nd, o *node) error {
	rs, err := nd.nodeRoutes()
	if err != nil {
		return err
	}
	for _, p := range []netip.Prefix{o.cidr4, o.cidr6} {
		if _, ok := rs[p]; !ok {
			return fmt.Errorf("no route to %s (have %v)", p, rs)
		}
	}
	return nil
}

// importPolicy imports doc on nd (removed at cleanup) and returns the
// repository revision.
func importPolicy(t *testing.T, nd *node, doc, name string) uint64 {
	t.Helper()
	res, err := nd.api.PolicyImport(context.Background(), []byte(doc), "")
	if err != nil {
		t.Fatalf("%s: PUT /v1/policy: %v", nd.name, err)
	}
	t.Cleanup(func() {
		if nd.proc.Running() {
			_, _ = nd.api.PolicyDelete(context.Background(), name)
		}
	})
	return res.Revision
}

// admits: p's endpoint computed revision rev (or later), enforces
// ingress, and its BPF policy map holds an ingress UDP port entry for
// each of ids.
func admits(p *pod, rev uint64, ids []uint32, port int) error {
	pol, err := p.node.api.EndpointPolicy(context.Background(), "container-id:"+p.rt.ContainerID)
	switch {
	case err != nil:
		return err
	case pol.PolicyRevision < rev:
		return fmt.Errorf("computed revision %d < %d", pol.PolicyRevision, rev)
	case !pol.IngressEnforced || !pol.RealizedIngressEnforced:
		return fmt.Errorf("ingress enforcement: computed %v, realised %v", pol.IngressEnforced, pol.RealizedIngressEnforced)
	}
	for _, id := range ids {
		if !slices.ContainsFunc(pol.Realized, func(e models.RealizedPolicyEntry) bool {
			return e.Identity == id && int(e.Port) == port && strings.EqualFold(e.Protocol, "udp") && e.Direction == "ingress"
		}) {
			return fmt.Errorf("no realised ingress UDP %d entry for identity %d in %s", port, id, jsonString(pol.Realized))
		}
	}
	return nil
}

// sink records the datagrams a pod receives on a UDP port (both
// families).
type sink struct {
	mu  sync.Mutex
	got []string
}

func listenSink(t *testing.T, p *pod, port int) *sink {
	t.Helper()
	s := &sink{}
	var conn *net.UDPConn
	if err := p.ns.Do(func() (err error) {
		conn, err = net.ListenUDP("udp", &net.UDPAddr{Port: port})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.got = append(s.got, string(buf[:n]))
			s.mu.Unlock()
		}
	}()
	return s
}

// has returns nil once payload arrived.
func (s *sink) has(payload string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if slices.Contains(s.got, payload) {
		return nil
	}
	return fmt.Errorf("not received (got %q)", s.got)
}

// forgery is one forged VXLAN datagram and where it must be dropped.
type forgery struct {
	name     string
	from     *testutil.NS // the sender's netns
	v        *victim      // whose target the inner packet goes to
	to       netip.Addr   // the outer destination, a node's address
	vni      uint32
	src, dst netip.Addr // the inner packet's
	dropAt   *node      // the node that must count the drop
	ep       int64      // under this endpoint (0: the overlay's)
	reason   string
	dir      string
}

var forgeries struct {
	sync.Mutex
	n int
}

// send writes the VXLAN datagram (from a UDP socket in f.from) and
// returns the inner datagram's payload.
func (f forgery) send(t *testing.T) string {
	t.Helper()
	forgeries.Lock()
	forgeries.n++
	payload := fmt.Sprintf("forged-%d-vni%d-%s", forgeries.n, f.vni, f.src)
	forgeries.Unlock()
	inner := testutil.UDPPacket(f.src, f.dst, 40000, targetPort, []byte(payload))
	etype := uint16(testutil.EtherTypeIPv4)
	if f.src.Is6() {
		etype = testutil.EtherTypeIPv6
	}
	frame := testutil.Frame(net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}, net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}, nil, etype, inner)
	if err := f.from.Do(func() error {
		conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(f.to, tunnelPort)))
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = conn.Write(testutil.VXLAN(f.vni, frame))
		return err
	}); err != nil {
		t.Fatalf("send VXLAN to %s: %v", f.to, err)
	}
	return payload
}

// mustDrop sends f, which f.dropAt must count as f.reason and which must
// never reach the target: a datagram the target's friend sends after the
// drop arrives, the forged one not.
func (f forgery) mustDrop(t *testing.T) {
	t.Helper()
	s, friend := f.v.sink, f.v.friend
	before := dropCount(t, f.dropAt, f.ep, f.reason, f.dir)
	payload := f.send(t)
	testutil.EventuallyErr(t, fmt.Sprintf("%s's %s drop on %s", payload, f.reason, f.dropAt.name), func() error {
		if s.has(payload) == nil {
			t.Fatalf("forged %q (VNI %d, inner source %s) delivered to the target", payload, f.vni, f.src)
		}
		if n := dropCount(t, f.dropAt, f.ep, f.reason, f.dir); n <= before {
			return fmt.Errorf("%s %s drops of endpoint %d: %d", f.dir, f.reason, f.ep, n)
		}
		return nil
	})
	control := fmt.Sprintf("control-after-%s", payload)
	if err := friend.ns.Do(func() error {
		conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(f.dst, targetPort)))
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = conn.Write([]byte(control))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyErr(t, control+" at the target", func() error { return s.has(control) })
	if s.has(payload) == nil {
		t.Fatalf("forged %q delivered to the target", payload)
	}
}

// dropCount reads nd's drop counter of endpoint ep (GET /v1/drops).
func dropCount(t *testing.T, nd *node, ep int64, reason, dir string) uint64 {
	t.Helper()
	ds, err := nd.api.Drops(context.Background())
	if err != nil {
		t.Fatalf("%s: GET /v1/drops: %v", nd.name, err)
	}
	for _, d := range ds {
		if d.Endpoint == ep && d.Reason == reason && d.Direction == dir {
			return d.Packets
		}
	}
	return 0
}
