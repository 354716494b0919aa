package multinode

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// remoteNodePolicyDoc lets only other nodes (the remote-node entity)
// reach app=node-target on UDP 9000.
const remoteNodePolicyDoc = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: from-remote-nodes
  namespace: default
spec:
  endpointSelector:
    matchLabels:
      app: node-target
  ingress:
  - fromEntities: [remote-node]
    toPorts:
    - ports: [{port: "9000", protocol: UDP}]
`

const remoteNodeID = 6 // reserved:remote-node

// TestTunnelRemoteNode (issue 36, remote-node in tunnel mode): node A's
// host sends its traffic through the tunnel as world (it must not pose
// as B's own host); B's overlay program gives world from one of A's own
// addresses the remote-node identity, as native routing does from the
// ipcache, so `fromEntities: [remote-node]` admits A's host on B. World
// from any other source A may send for stays world: a VXLAN datagram A
// writes itself with VNI world and an inner source of its pod's address
// is dropped by the target's policy. Both families.
func TestTunnelRemoteNode(t *testing.T) {
	c := newCluster(t, "tunnel", 2, 89)
	a, b := c.nodes[0], c.nodes[1]
	waitRoutes(t, a, b)
	other := a.addPod("other")
	target := b.addPod("node-target")
	labelPod(t, target, "k8s:app=node-target")
	rev := importPolicy(t, b, remoteNodePolicyDoc, "from-remote-nodes")
	testutil.EventuallyErr(t, b.name+"'s target admitting remote-node", func() error {
		return admits(target, rev, []uint32{remoteNodeID}, targetPort)
	})
	s := listenSink(t, target, targetPort)
	targetEP := endpointOf(t, target).ID
	n := 0
	for _, v6 := range []bool{false, true} {
		fam := map[bool]string{false: "ipv4", true: "ipv6"}[v6]
		pick := func(x4, x6 netip.Addr) netip.Addr { return map[bool]netip.Addr{false: x4, true: x6}[v6] }
		dst := pick(target.ip4, target.ip6)
		fromHost := func() string {
			n++
			payload := fmt.Sprintf("from-%s-host-%s-%d", a.name, fam, n)
			if err := a.ns.Do(func() error {
				conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, targetPort)))
				if err != nil {
					return err
				}
				defer conn.Close()
				_, err = conn.Write([]byte(payload))
				return err
			}); err != nil {
				t.Fatal(err)
			}
			return payload
		}
		t.Run("host-"+fam, func(t *testing.T) {
			payload := fromHost()
			testutil.EventuallyErr(t, payload+" at the target", func() error {
				if err := s.has(payload); err != nil {
					ds, _ := b.api.Drops(context.Background())
					return fmt.Errorf("%w (%s's drops: %s)", err, b.name, jsonString(ds))
				}
				return nil
			})
		})
		t.Run("world-from-pod-address-"+fam, func(t *testing.T) {
			before := dropCount(t, b, targetEP, "policy-denied", "ingress")
			f := forgery{from: a.ns, to: pick(b.addr4, b.addr6), vni: 2, src: pick(other.ip4, other.ip6), dst: dst}
			forged := f.send(t)
			testutil.EventuallyErr(t, forged+"'s policy drop on "+b.name, func() error {
				if s.has(forged) == nil {
					t.Fatalf("world from %s (a pod's address on %s) delivered to a remote-node-only target", f.src, a.name)
				}
				if n := dropCount(t, b, targetEP, "policy-denied", "ingress"); n <= before {
					ds, _ := b.api.Drops(context.Background())
					return fmt.Errorf("ingress policy drops of endpoint %d: %d (drops: %s)", targetEP, n, jsonString(ds))
				}
				return nil
			})
			control := fromHost()
			testutil.EventuallyErr(t, control+" at the target", func() error { return s.has(control) })
			if s.has(forged) == nil {
				t.Fatalf("forged %q delivered to the target", forged)
			}
		})
	}
}
