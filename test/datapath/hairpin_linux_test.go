package datapath_test

import (
	"bufio"
	"context"
	"net"
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/domain/service"
	"github.com/membrane-cni/membrane/test/policyscenario"
)

// cnpSelfEgressOnly enforces both directions on app=self: egress to
// itself allowed, ingress only from app=other.
const cnpSelfEgressOnly = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: self-egress
  namespace: default
spec:
  endpointSelector:
    matchLabels:
      app: self
  egress:
  - toEndpoints:
    - matchLabels:
        k8s:app: self
  ingress:
  - fromEndpoints:
    - matchLabels:
        k8s:app: other
`

// cnpSelfIngress lets app=self in from itself.
const cnpSelfIngress = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: self-ingress
  namespace: default
spec:
  endpointSelector:
    matchLabels:
      app: self
  ingress:
  - fromEndpoints:
    - matchLabels:
        k8s:app: self
`

// TestServiceHairpin is issue #35's hairpin (upstream conformance:
// "should allow pods to hairpin back to themselves through services"):
// a pod reaches a ClusterIP whose only backend is itself, TCP and UDP,
// IPv4 and IPv6, and the replies come from the frontend. Policy still
// applies, with the pod's own identity on both sides: with egress to
// itself allowed but ingress only from app=other the hairpin is dropped
// at ingress with the pod's identity as peer (not world, the hairpin
// address's); allowing ingress from itself lets it through.
func TestServiceHairpin(t *testing.T) {
	e := newEnvStack(t, "10.235.0.0/24", "fd00:235::/120")
	startAgent(e, nil)
	c := e.Client()
	self := addPolicyPod(t, e, c, "self", "k8s:app=self")
	self.nameServer(t, 8080)
	self.peerServer(t, 8081)
	ctx := context.Background()
	vips := []netip.Addr{netip.MustParseAddr("10.96.35.10"), netip.MustParseAddr("fd00:96::35:10")}
	var svcs []service.Service
	for _, vip := range vips {
		peer := svcOf("self-peer", vip, 81, service.TCP)
		peer.Backends = []service.Backend{{Addr: self.ip(vip), Port: 8081}}
		svcs = append(svcs, svcOf("self", vip, 80, service.TCP, self), svcOf("self", vip, 53, service.UDP, self), peer)
	}
	if _, err := e.Agent.System.ReplaceServices(ctx, "test", svcs); err != nil {
		t.Fatal(err)
	}
	hairpin := func(t *testing.T) {
		t.Helper()
		for _, vip := range vips {
			for range 3 { // new connections, each a new source port
				if got := self.whoTCP(t, netip.AddrPortFrom(vip, 80)); got != "self" {
					t.Errorf("TCP to %s:80 reached %q, want self", vip, got)
				}
				if got := self.whoUDP(t, netip.AddrPortFrom(vip, 53)); got != "self" {
					t.Errorf("UDP to %s:53 reached %q, want self", vip, got)
				}
			}
		}
	}
	t.Run("no policy", hairpin)
	t.Run("the backend sees the hairpin address", func(t *testing.T) {
		for vip, want := range map[netip.Addr]string{vips[0]: "169.254.42.1", vips[1]: "100::a9fe:2a01"} {
			if got := self.whoTCP(t, netip.AddrPortFrom(vip, 81)); got != want {
				t.Errorf("via %s the backend saw its client as %q, want %s", vip, got, want)
			}
		}
	})

	if _, err := c.PolicyImport(ctx, []byte(cnpSelfEgressOnly), client.ContentTypeYAML); err != nil {
		t.Fatal(err)
	}
	selfID := identity.NumericIdentity(self.ep.Identity.ID)
	policyscenario.WaitRealized(t, c, self.ep.ID, "self: egress to itself, ingress enforced", func(m *policy.MapState) bool {
		return m.Enforced(policy.Egress) && m.Enforced(policy.Ingress) && m.Allows(selfID, 8080, policy.ProtoTCP, policy.Egress)
	})
	drops := watchDrops(t, c)
	for _, vip := range vips {
		t.Run("ingress not allowing itself drops the hairpin "+vip.String(), func(t *testing.T) {
			if s, err := self.dialService(vip, 80, deniedDial); err == nil {
				s.c.Close()
				t.Fatalf("self -> %s:80 connected; want the hairpin dropped by its ingress policy", vip)
			}
			ev := drops.wait(t, "the hairpin via "+vip.String(), func(ev events.Event) bool {
				return ev.Endpoint == uint16(self.ep.ID) && ev.Drop.Dst == self.ip(vip).String() && ev.Drop.DstPort == 8080
			})
			if ev.Drop.Reason != "policy-denied" || ev.Drop.Direction != "ingress" || ev.Drop.PeerIdentity != uint32(selfID) {
				t.Errorf("drop event = %+v; want policy-denied ingress from the pod's own identity %d", *ev.Drop, selfID)
			}
		})
	}

	if _, err := c.PolicyImport(ctx, []byte(cnpSelfIngress), client.ContentTypeYAML); err != nil {
		t.Fatal(err)
	}
	policyscenario.WaitRealized(t, c, self.ep.ID, "self: ingress from itself", func(m *policy.MapState) bool {
		return m.Allows(selfID, 8080, policy.ProtoTCP, policy.Ingress) && m.Allows(selfID, 8080, policy.ProtoUDP, policy.Ingress)
	})
	t.Run("policy allowing itself both ways", hairpin)
}

// peerServer answers every line on TCP port of the pod's addresses with
// the address the connection came from.
func (p *policyPod) peerServer(t *testing.T, port int) {
	t.Helper()
	for _, ip := range p.ips {
		var ln net.Listener
		if err := p.NS.Do(func() (err error) {
			ln, err = net.Listen("tcp", netip.AddrPortFrom(ip, uint16(port)).String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					r := bufio.NewReader(c)
					for {
						if _, err := r.ReadString('\n'); err != nil {
							return
						}
						from := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
						if _, err := c.Write([]byte(from.String() + "\n")); err != nil {
							return
						}
					}
				}()
			}
		}()
	}
}
