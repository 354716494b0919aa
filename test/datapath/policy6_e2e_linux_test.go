package datapath_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
	"github.com/membrane-cni/membrane/test/policyscenario"
)

// cnpIPv6 selects app=a both ways, by IPv6 CIDR and by labels:
// egress to fd00:99::/64 on TCP 8081 and to app=b on TCP 8080; ingress
// from fd00:99::/64 and from app=c on TCP 9000.
const cnpIPv6 = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: v6, namespace: default}
spec:
  endpointSelector:
    matchLabels: {app: a}
  egress:
  - toCIDR: ["fd00:99::/64"]
    toPorts: [{ports: [{port: "8081", protocol: TCP}]}]
  - toEndpoints: [{matchLabels: {app: b}}]
    toPorts: [{ports: [{port: "8080", protocol: TCP}]}]
  ingress:
  - fromCIDRSet: [{cidr: "fd00:99::/64"}]
    toPorts: [{ports: [{port: "9000", protocol: TCP}]}]
  - fromEndpoints: [{matchLabels: {app: c}}]
    toPorts: [{ports: [{port: "9000", protocol: TCP}]}]
`

// TestPolicyIPv6CIDRsAndSelectors: a CiliumNetworkPolicy with IPv6 CIDR
// peers and label selectors, enforced on IPv6 traffic in both directions
// of one pod. The "outside" addresses live on the test's host netns (on a
// veth standing in for the node's NIC), so the agent, which follows the
// host's addresses, gives them the host identity; the CIDR rules decide on
// the address whatever its identity: fd00:99::5 falls in the policy's
// CIDR, fd00:98::5 does not. The CIDR is in the ipcache, the pods' /128s
// too, and the drops are reported with their IPv6 addresses.
func TestPolicyIPv6CIDRsAndSelectors(t *testing.T) {
	e := newEnvStack(t, "10.231.6.0/24", "fd00:231:6::/120")
	startAgent(e, nil)
	inCIDR, outside := netip.MustParseAddr("fd00:99::5"), netip.MustParseAddr("fd00:98::5")
	outsideAddrs(t, e, inCIDR, outside)
	c := e.Client()
	// The stand-ins for outside peers are addresses of the host netns,
	// which the agent follows as the host identity.
	testutil.Eventually(t, "the stand-in addresses in the ipcache as host", func() bool {
		entries, err := c.IPCache(context.Background())
		n := 0
		for _, en := range entries {
			if (en.CIDR == netip.PrefixFrom(inCIDR, 128).String() || en.CIDR == netip.PrefixFrom(outside, 128).String()) && en.Identity == uint32(identity.ReservedHost) {
				n++
			}
		}
		return err == nil && n == 2
	})
	a := addPolicyPod(t, e, c, "pod-a", "k8s:app=a")
	b := addPolicyPod(t, e, c, "pod-b", "k8s:app=b")
	cc := addPolicyPod(t, e, c, "pod-c", "k8s:app=c")
	a6, b6, c6 := a.ips[1], b.ips[1], cc.ips[1]
	for _, p := range []*policyPod{b, cc} {
		testutil.EchoServer(t, p.NS, p.ips[1], 8080)
	}
	testutil.EchoServer(t, a.NS, a6, 9000)
	for _, ip := range []netip.Addr{inCIDR, outside} {
		testutil.EchoServer(t, e.NS, ip, 8081)
	}
	drops := watchDrops(t, c)

	if _, err := c.PolicyImport(context.Background(), []byte(cnpIPv6), client.ContentTypeYAML); err != nil {
		t.Fatal(err)
	}
	idB, idC := identity.NumericIdentity(b.ep.Identity.ID), identity.NumericIdentity(cc.ep.Identity.ID)
	policyscenario.WaitRealized(t, c, a.ep.ID, "A's IPv6 policy", func(m *policy.MapState) bool {
		return m.Enforced(policy.Ingress) && m.Enforced(policy.Egress) &&
			m.Allows(idB, 8080, policy.ProtoTCP, policy.Egress) && m.Allows(idC, 9000, policy.ProtoTCP, policy.Ingress)
	})
	entries, err := c.IPCache(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"fd00:99::/64": "cidr-policy", a6.String() + "/128": "endpoint", b6.String() + "/128": "endpoint"}
	for _, en := range entries {
		if src, ok := want[en.CIDR]; ok && src == en.Source {
			delete(want, en.CIDR)
		}
	}
	if len(want) != 0 {
		t.Fatalf("ipcache %+v lacks %v", entries, want)
	}

	// Egress: by CIDR and by labels.
	exchange := func(from *testutil.NS, src, dst netip.Addr, port int, timeout time.Duration) error {
		return dialFrom(from, src, dst, port, timeout)
	}
	if err := exchange(a.NS, netip.Addr{}, inCIDR, 8081, 5*time.Second); err != nil {
		t.Errorf("A -> %s:8081 (in the CIDR): %v; want it to pass", inCIDR, err)
	}
	if err := exchange(a.NS, netip.Addr{}, outside, 8081, deniedDial); err == nil {
		t.Errorf("A -> %s:8081 (outside the CIDR) passed; want it dropped", outside)
	}
	if err := exchange(a.NS, netip.Addr{}, b6, 8080, 5*time.Second); err != nil {
		t.Errorf("A -> B %s:8080: %v; want it to pass", b6, err)
	}
	if err := exchange(a.NS, netip.Addr{}, c6, 8080, deniedDial); err == nil {
		t.Errorf("A -> C %s:8080 passed; want it dropped", c6)
	}
	// Ingress: by CIDR (the host dials from each outside address) and by
	// labels.
	if err := exchange(e.NS, inCIDR, a6, 9000, 5*time.Second); err != nil {
		t.Errorf("%s -> A:9000: %v; want it to pass", inCIDR, err)
	}
	if err := exchange(e.NS, outside, a6, 9000, deniedDial); err == nil {
		t.Errorf("%s -> A:9000 passed; want it dropped", outside)
	}
	if err := exchange(cc.NS, netip.Addr{}, a6, 9000, 5*time.Second); err != nil {
		t.Errorf("C -> A %s:9000: %v; want it to pass", a6, err)
	}
	if err := exchange(b.NS, netip.Addr{}, a6, 9000, deniedDial); err == nil {
		t.Errorf("B -> A %s:9000 passed; want it dropped", a6)
	}

	for _, d := range []struct {
		dir      string
		src, dst netip.Addr
		port     uint16
		peer     identity.NumericIdentity
	}{
		{"egress", a6, outside, 8081, identity.ReservedHost},
		{"egress", a6, c6, 8080, idC},
		{"ingress", outside, a6, 9000, identity.ReservedHost},
		{"ingress", b6, a6, 9000, idB},
	} {
		ev := drops.wait(t, d.dir+" "+d.src.String()+" -> "+d.dst.String(), func(ev events.Event) bool {
			return ev.Endpoint == uint16(a.ep.ID) && ev.Drop.Src == d.src.String() && ev.Drop.Dst == d.dst.String() && ev.Drop.DstPort == d.port
		})
		if ev.Drop.Reason != "policy-denied" || ev.Drop.Direction != d.dir || ev.Drop.Proto != 6 || ev.Drop.PeerIdentity != uint32(d.peer) {
			t.Errorf("drop %+v: want policy-denied, %s, TCP, peer identity %d", *ev.Drop, d.dir, d.peer)
		}
	}
}

// outsideAddrs puts ips (/128 each) on a veth pair in the test's host
// netns, standing in for addresses beyond the node.
func outsideAddrs(t *testing.T, e *nodeharness.Node, ips ...netip.Addr) {
	t.Helper()
	nl := e.NS.Netlink(t)
	attrs := netlink.NewLinkAttrs()
	attrs.Name = "mbtext0"
	if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "mbtext1"}); err != nil {
		t.Fatal(err)
	}
	link, err := nl.LinkByName(attrs.Name)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := nl.LinkByName("mbtext1")
	if err != nil {
		t.Fatal(err)
	}
	errs := []error{nl.LinkSetUp(link), nl.LinkSetUp(peer)}
	for _, ip := range ips {
		errs = append(errs, nl.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD}))
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// dialFrom connects from ns (from src, when valid) to dst:port and
// exchanges a message both ways.
func dialFrom(ns *testutil.NS, src, dst netip.Addr, port int, timeout time.Duration) error {
	return ns.Do(func() error {
		d := net.Dialer{Timeout: timeout}
		if src.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
		}
		conn, err := d.Dial("tcp", netip.AddrPortFrom(dst, uint16(port)).String())
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write([]byte("probe")); err != nil {
			return err
		}
		_, err = io.ReadFull(conn, make([]byte, 5))
		return err
	})
}
