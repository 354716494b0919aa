package multinode

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestMultiNode runs a 3-node cluster per routing mode: pods reach each
// other on one node and across nodes (TCP and ICMP, IPv4 and IPv6),
// traffic to an address outside the cluster's pod ranges is masqueraded
// to the node's address, and a node removed from the nodes file loses
// its routes on the others.
func TestMultiNode(t *testing.T) {
	for i, mode := range []string{"native", "tunnel"} {
		t.Run(mode, func(t *testing.T) {
			c := newCluster(t, mode, 3, 81+i)
			a, b, cn := c.nodes[0], c.nodes[1], c.nodes[2]
			waitRoutes(t, a, b, cn)
			pa1, pa2 := a.addPod("a1"), a.addPod("a2")
			pb, pc := b.addPod("b1"), cn.addPod("c1")
			t.Run("same-node", func(t *testing.T) { reach(t, pa1, pa2) })
			t.Run("cross-node", func(t *testing.T) { reach(t, pa1, pb); reach(t, pb, pc); reach(t, pc, pa2) })
			t.Run("masquerade", func(t *testing.T) { masquerade(t, c, pa1, a) })
			t.Run("agent-restart", func(t *testing.T) { agentRestart(t, b, pa1, pb) })
			t.Run("node-removed", func(t *testing.T) { removeNode(t, c, a, cn, pa1, pc) })
		})
	}
}

// waitRoutes waits until every node routes the others' pod CIDRs.
func waitRoutes(t *testing.T, nodes ...*node) {
	t.Helper()
	for _, nd := range nodes {
		testutil.EventuallyErr(t, nd.name+"'s routes to the other nodes", func() error {
			rs, err := nd.nodeRoutes()
			if err != nil {
				return err
			}
			for _, o := range nodes {
				if o == nd {
					continue
				}
				for _, p := range []netip.Prefix{o.cidr4, o.cidr6} {
					via, ok := rs[p]
					if !ok {
						return fmt.Errorf("no route to %s (have %v)", p, rs)
					}
					// Native: via the node's address of the family; tunnel: into the device.
					want := "via " + o.addr4.String()
					if p.Addr().Is6() {
						want = "via " + o.addr6.String()
					}
					if nd.c.routing == "tunnel" {
						want = "dev " + strconv.Itoa(nd.tunnelIndex(t))
					}
					if via != want {
						return fmt.Errorf("route to %s is %q, want %q", p, via, want)
					}
				}
			}
			return nil
		})
	}
}

// reach checks TCP both ways over both families, and ICMP echo.
func reach(t *testing.T, x, y *pod) {
	t.Helper()
	for _, pair := range [][2]*pod{{x, y}, {y, x}} {
		from, to := pair[0], pair[1]
		for _, ip := range []netip.Addr{to.ip4, to.ip6} {
			port := int(nextPort.Add(1))
			testutil.EchoServer(t, to.ns, ip, port)
			if err := testutil.Exchange(from.ns, ip, port, 10*time.Second); err != nil {
				t.Fatalf("TCP %s -> %s (%s): %v", from.name, to.name, ip, err)
			}
			if out, err := from.ns.Exec("ping", "-c", "1", "-W", "5", ip.String()); err != nil {
				t.Fatalf("ICMP %s -> %s (%s): %v\n%s", from.name, to.name, ip, err, out)
			}
		}
	}
}

// masquerade: a pod's connection to the outside host (not in any pod
// range, no route back to the pods) works, and the outside sees the
// node's address as the peer.
func masquerade(t *testing.T, c *cluster, p *pod, nd *node) {
	out4, out6 := c.underlayAddrs(199)
	for _, pair := range [][2]netip.Addr{{out4, nd.addr4}, {out6, nd.addr6}} {
		dst, want := pair[0], pair[1]
		var ln net.Listener
		if err := c.outside.Do(func() (err error) {
			ln, err = net.Listen("tcp", net.JoinHostPort(dst.String(), "8080"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		peer := make(chan string, 1)
		go func() {
			conn, err := ln.Accept()
			if err != nil {
				peer <- err.Error()
				return
			}
			peer <- conn.RemoteAddr().String()
			_, _ = io.Copy(conn, conn)
			conn.Close()
		}()
		err := testutil.Exchange(p.ns, dst, 8080, 10*time.Second)
		ln.Close()
		if err != nil {
			t.Fatalf("pod %s -> outside %s: %v", p.name, dst, err)
		}
		got := <-peer
		host, _, _ := net.SplitHostPort(got)
		if host != want.String() {
			t.Fatalf("outside saw peer %s, want the node's address %s", got, want)
		}
	}
}

// agentRestart stops nd's agent: pods keep reaching each other across
// nodes (routes, tunnel device and programs outlive the agent); after
// the restart they still do and nd's routes are unchanged.
func agentRestart(t *testing.T, nd *node, x, y *pod) {
	before, err := nd.nodeRoutes()
	if err != nil {
		t.Fatal(err)
	}
	nd.stop()
	reach(t, x, y)
	if err := nd.start(); err != nil {
		t.Fatal(err)
	}
	reach(t, x, y)
	after, err := nd.nodeRoutes()
	if err != nil {
		t.Fatal(err)
	}
	if jsonString(after) != jsonString(before) {
		t.Fatalf("%s's routes after the restart %v, before %v", nd.name, after, before)
	}
}

// removeNode drops node gone from the nodes file: the other nodes lose
// their routes to its pod CIDRs and list it no more; traffic to its pods
// no longer gets through.
func removeNode(t *testing.T, c *cluster, keep, gone *node, from *pod, to *pod) {
	var rest []*node
	for _, nd := range c.nodes {
		if nd != gone {
			rest = append(rest, nd)
		}
	}
	c.writeNodesFile(rest)
	testutil.EventuallyErr(t, "the removed node's routes gone", func() error {
		rs, err := keep.nodeRoutes()
		if err != nil {
			return err
		}
		for _, p := range []netip.Prefix{gone.cidr4, gone.cidr6} {
			if via, ok := rs[p]; ok {
				return fmt.Errorf("route to %s still %s", p, via)
			}
		}
		return nil
	})
	out, err := keep.api.Nodes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(jsonString(out), gone.name) {
		t.Fatalf("GET /v1/nodes still lists %s: %s", gone.name, jsonString(out))
	}
	port := int(nextPort.Add(1))
	testutil.EchoServer(t, to.ns, to.ip4, port)
	if err := testutil.Exchange(from.ns, to.ip4, port, 2*time.Second); err == nil {
		t.Fatalf("TCP to %s on removed node %s still works", to.ip4, gone.name)
	}
}

// nextPort numbers the echo servers' ports (each listens until its test ends).
var nextPort atomic.Int32

func init() { nextPort.Store(7000) }
