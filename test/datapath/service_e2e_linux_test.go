package datapath_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/domain/service"
	"github.com/membrane-cni/membrane/test/policyscenario"
)

// cnpClientToDB lets app=client talk to app=db only (egress enforced).
const cnpClientToDB = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: client-to-db
  namespace: default
spec:
  endpointSelector:
    matchLabels:
      app: client
  egress:
  - toEndpoints:
    - matchLabels:
        k8s:app: db
`

// cnpDBFromClient lets only app=client into app=db (ingress enforced):
// the backend must see the client's address, not the frontend's.
const cnpDBFromClient = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: db-from-client
  namespace: default
spec:
  endpointSelector:
    matchLabels:
      app: db
  ingress:
  - fromEndpoints:
    - matchLabels:
        k8s:app: client
`

// nameServer answers every line (TCP) or datagram (UDP) on port of the
// pod's addresses with the pod's name, so a client learns which backend
// it reached; a TCP connection stays open for more lines.
func (p *policyPod) nameServer(t *testing.T, port int) {
	t.Helper()
	name := podName(p)
	for _, ip := range p.ips {
		addr := net.JoinHostPort(ip.String(), strconv.Itoa(port))
		var (
			ln net.Listener
			pc net.PacketConn
		)
		if err := p.NS.Do(func() (err error) {
			if ln, err = net.Listen("tcp", addr); err != nil {
				return err
			}
			pc, err = net.ListenPacket("udp", addr)
			return err
		}); err != nil {
			t.Fatalf("name server on %s: %v", addr, err)
		}
		t.Cleanup(func() { ln.Close(); pc.Close() })
		go serveNameTCP(ln, name)
		go serveNameUDP(pc, name)
	}
}

func serveNameTCP(ln net.Listener, name string) {
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
				if _, err := c.Write([]byte(name + "\n")); err != nil {
					return
				}
			}
		}()
	}
}

func serveNameUDP(pc net.PacketConn, name string) {
	buf := make([]byte, 64)
	for {
		_, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		_, _ = pc.WriteTo([]byte(name), from)
	}
}

// svcConn is a TCP connection from a pod to a frontend.
type svcConn struct {
	c net.Conn
	r *bufio.Reader
}

// dialService connects from p to addr:port within timeout.
func (p *policyPod) dialService(addr netip.Addr, port int, timeout time.Duration) (*svcConn, error) {
	var c net.Conn
	err := p.NS.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", net.JoinHostPort(addr.String(), strconv.Itoa(port)), timeout)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &svcConn{c: c, r: bufio.NewReader(c)}, nil
}

// who asks the backend's name over the connection.
func (s *svcConn) who() (string, error) {
	_ = s.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := s.c.Write([]byte("who\n")); err != nil {
		return "", err
	}
	line, err := s.r.ReadString('\n')
	return strings.TrimSpace(line), err
}

// whoTCP opens a connection to the frontend, asks the backend's name and
// checks the reply came from the frontend (reverse translation).
func (p *policyPod) whoTCP(t *testing.T, fe netip.AddrPort) string {
	t.Helper()
	s, err := p.dialService(fe.Addr(), int(fe.Port()), 5*time.Second)
	if err != nil {
		t.Fatalf("%s -> %s: %v", podName(p), fe, err)
	}
	defer s.c.Close()
	if got := s.c.RemoteAddr().(*net.TCPAddr).AddrPort(); netip.AddrPortFrom(got.Addr().Unmap(), got.Port()) != fe {
		t.Errorf("connection's peer is %s, want the frontend %s", got, fe)
	}
	name, err := s.who()
	if err != nil {
		t.Fatalf("%s -> %s: %v", podName(p), fe, err)
	}
	return name
}

// whoUDP sends one datagram from a new socket to the frontend and
// returns the backend's name; the reply must come from the frontend
// (a connected UDP socket takes nothing else).
func (p *policyPod) whoUDP(t *testing.T, fe netip.AddrPort) string {
	t.Helper()
	var name string
	err := p.NS.Do(func() error {
		c, err := net.Dial("udp", fe.String())
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 64)
		for try := 0; try < 5; try++ { // datagrams may be lost; bounded
			_ = c.SetDeadline(time.Now().Add(time.Second))
			if _, err := c.Write([]byte("who")); err != nil {
				return err
			}
			n, err := c.Read(buf)
			if err == nil {
				name = string(buf[:n])
				return nil
			}
		}
		return fmt.Errorf("no UDP answer from %s", fe)
	})
	if err != nil {
		t.Fatalf("%s -> %s/udp: %v", podName(p), fe, err)
	}
	return name
}

// svcOf builds a ClusterIP service of frontend vip:port over backends'
// addresses of vip's family, backend port 8080.
func svcOf(name string, vip netip.Addr, port uint16, proto uint8, backends ...*policyPod) service.Service {
	s := service.Service{Frontend: service.Frontend{Addr: vip, Port: port, Proto: proto}, Name: "default/" + name, Kind: service.KindClusterIP}
	for _, b := range backends {
		s.Backends = append(s.Backends, service.Backend{Addr: b.ip(vip), Port: 8080})
	}
	return s
}

// TestServiceEndToEnd is issue #19's test: ClusterIP services translated
// to backends in the from-container program before policy, with pods
// made by the CNI plugin, real TCP and UDP over IPv4 and IPv6. The
// client's egress policy allows only app=db: a service whose backends
// are app=db passes (and connections spread over both backends), one
// whose backend is app=other is dropped with the backend's identity.
func TestServiceEndToEnd(t *testing.T) {
	e := newEnvStack(t, "10.233.0.0/24", "fd00:233::/120")
	startAgent(e, nil)
	c := e.Client()
	cl := addPolicyPod(t, e, c, "client", "k8s:app=client")
	db1 := addPolicyPod(t, e, c, "db-1", "k8s:app=db")
	db2 := addPolicyPod(t, e, c, "db-2", "k8s:app=db")
	other := addPolicyPod(t, e, c, "other", "k8s:app=other")
	for _, p := range []*policyPod{db1, db2, other} {
		p.nameServer(t, 8080)
	}
	sys := e.Agent.System
	ctx := context.Background()
	vips := []netip.Addr{netip.MustParseAddr("10.96.33.10"), netip.MustParseAddr("fd00:96::10")}
	otherVIPs := []netip.Addr{netip.MustParseAddr("10.96.33.20"), netip.MustParseAddr("fd00:96::20")}
	var svcs []service.Service
	for i, vip := range vips {
		svcs = append(svcs, svcOf("db", vip, 5432, service.TCP, db1, db2), svcOf("db", vip, 53, service.UDP, db1, db2),
			svcOf("other", otherVIPs[i], 5432, service.TCP, other))
	}
	if _, err := sys.ReplaceServices(ctx, "test", svcs); err != nil {
		t.Fatal(err)
	}
	for _, imp := range []string{cnpClientToDB, cnpDBFromClient} {
		if _, err := c.PolicyImport(ctx, []byte(imp), client.ContentTypeYAML); err != nil {
			t.Fatal(err)
		}
	}
	policyscenario.WaitRealized(t, c, cl.ep.ID, "client egress to db only", func(m *policy.MapState) bool {
		return m.Enforced(policy.Egress) && m.Allows(identity.NumericIdentity(db1.ep.Identity.ID), 8080, policy.ProtoTCP, policy.Egress)
	})
	policyscenario.WaitRealized(t, c, db1.ep.ID, "db ingress from client only", func(m *policy.MapState) bool {
		return m.Enforced(policy.Ingress) && m.Allows(identity.NumericIdentity(cl.ep.Identity.ID), 8080, policy.ProtoTCP, policy.Ingress)
	})
	policyscenario.WaitRealized(t, c, db2.ep.ID, "db ingress from client only", func(m *policy.MapState) bool {
		return m.Enforced(policy.Ingress)
	})
	drops := watchDrops(t, c)
	const conns = 24

	for _, vip := range vips {
		fe := netip.AddrPortFrom(vip, 5432)
		t.Run("TCP spreads over both allowed backends "+vip.String(), func(t *testing.T) {
			seen := map[string]int{}
			for range conns {
				seen[cl.whoTCP(t, fe)]++
			}
			if seen["db-1"] == 0 || seen["db-2"] == 0 || len(seen) != 2 {
				t.Errorf("%d connections to %s reached %v; want both db-1 and db-2 only", conns, fe, seen)
			}
		})
		t.Run("UDP spreads over both allowed backends "+vip.String(), func(t *testing.T) {
			seen := map[string]int{}
			for range conns {
				seen[cl.whoUDP(t, netip.AddrPortFrom(vip, 53))]++
			}
			if seen["db-1"] == 0 || seen["db-2"] == 0 || len(seen) != 2 {
				t.Errorf("%d UDP exchanges with %s reached %v; want both db-1 and db-2 only", conns, vip, seen)
			}
		})
	}
	for i, vip := range otherVIPs {
		t.Run("a service whose backend the policy does not allow is dropped "+vip.String(), func(t *testing.T) {
			if s, err := cl.dialService(vip, 5432, deniedDial); err == nil {
				s.c.Close()
				t.Fatalf("client -> %s:5432 (backend app=other) connected; want it dropped by egress policy", vip)
			}
			backend := other.ip(vips[i])
			ev := drops.wait(t, "client -> other via "+vip.String(), func(ev events.Event) bool {
				return ev.Endpoint == uint16(cl.ep.ID) && ev.Drop.Dst == backend.String() && ev.Drop.DstPort == 8080
			})
			if ev.Drop.Reason != "policy-denied" || ev.Drop.Direction != "egress" || ev.Drop.PeerIdentity != uint32(other.ep.Identity.ID) {
				t.Errorf("drop event = %+v; want policy-denied egress to the backend's identity %d", *ev.Drop, other.ep.Identity.ID)
			}
		})
	}
	for _, vip := range vips {
		t.Run("backend removal: new connections avoid it, open ones drain "+vip.String(), func(t *testing.T) {
			fe := netip.AddrPortFrom(vip, 5432)
			open := dialUntil(t, cl, fe, "db-1")
			defer open.c.Close()
			db := svcOf("db", vip, 5432, service.TCP, db2)
			if _, err := sys.UpsertService(ctx, "test", db); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = sys.UpsertService(ctx, "test", svcOf("db", vip, 5432, service.TCP, db1, db2)) })
			for range conns {
				if got := cl.whoTCP(t, fe); got != "db-2" {
					t.Fatalf("a new connection to %s reached %s after db-1 left the service", fe, got)
				}
			}
			if got, err := open.who(); err != nil || got != "db-1" {
				t.Errorf("the connection open to db-1 before its removal: %q, %v; want it drained (still db-1)", got, err)
			}
		})
	}
	t.Run("ClientIP affinity keeps the client on one backend", func(t *testing.T) {
		sticky := svcOf("sticky", netip.MustParseAddr("10.96.33.40"), 5432, service.TCP, db1, db2)
		sticky.Affinity = time.Minute
		if _, err := sys.UpsertService(ctx, "test", sticky); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = sys.DeleteService(ctx, "test", sticky.Frontend) })
		seen := map[string]int{}
		for range conns {
			seen[cl.whoTCP(t, netip.AddrPortFrom(sticky.Frontend.Addr, 5432))]++
		}
		if len(seen) != 1 {
			t.Errorf("%d connections with ClientIP affinity reached %v; want one backend", conns, seen)
		}
	})
	t.Run("a service without backends drops new connections", func(t *testing.T) {
		empty := svcOf("empty", netip.MustParseAddr("10.96.33.30"), 80, service.TCP)
		if _, err := sys.UpsertService(ctx, "test", empty); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = sys.DeleteService(ctx, "test", empty.Frontend) })
		if s, err := cl.dialService(empty.Frontend.Addr, 80, deniedDial); err == nil {
			s.c.Close()
			t.Fatal("connected to a service without backends")
		}
		drops.wait(t, "no-backend drop", func(ev events.Event) bool {
			return ev.Endpoint == uint16(cl.ep.ID) && ev.Drop.Reason == "no-backend" && ev.Drop.Dst == "10.96.33.30" && ev.Drop.DstPort == 80
		})
	})
	t.Run("the API and the maps agree", func(t *testing.T) {
		l, err := c.Services(ctx, true)
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Services) != len(svcs) || l.Maps == nil || l.Maps.Frontends != len(svcs) || l.Maps.Connections == 0 || l.Maps.ReverseNAT == 0 || len(l.Maps.Orphans) != 0 {
			t.Fatalf("GET /v1/service?maps=true = %d services, maps %+v (%s); want %d frontends with traffic", len(l.Services), l.Maps, l.MapsError, len(svcs))
		}
		for _, s := range l.Services {
			if s.State != "realized" || s.Source != "test" || s.Realized == nil || s.Realized.ID != s.ID ||
				strings.Join(s.Realized.Backends, ",") != strings.Join(s.Backends, ",") {
				t.Errorf("service %+v: the maps hold %+v", s, s.Realized)
			}
		}
	})
}

// dialUntil opens connections to fe until one reaches backend name
// (bounded) and returns it open.
func dialUntil(t *testing.T, p *policyPod, fe netip.AddrPort, name string) *svcConn {
	t.Helper()
	for range 64 {
		s, err := p.dialService(fe.Addr(), int(fe.Port()), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.who()
		if err != nil {
			s.c.Close()
			t.Fatal(err)
		}
		if got == name {
			return s
		}
		s.c.Close()
	}
	t.Fatalf("64 connections to %s never reached %s", fe, name)
	return nil
}
