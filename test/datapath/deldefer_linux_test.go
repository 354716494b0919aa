package datapath_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

// plainMetric is the value of the agent's metric name without labels;
// -1 when it is not there.
func plainMetric(t *testing.T, e *nodeharness.Node, name string) float64 {
	t.Helper()
	mfs, err := e.Agent.Metrics().Registry().Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() != name || len(m.GetLabel()) != 0 {
				continue
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// ping reports whether one ping from p to ip is answered within a second.
func ping(p *nodeharness.Pod, ip netip.Addr) bool {
	_, err := p.NS.Exec("ping", "-c", "1", "-W", "1", ip.String())
	return err == nil
}

// TestDelTombstoneReAdd: DEL leaves both ends of the pair down under
// tombstone names (the deletion deferred), so an ADD of the same
// container ID and CNI_IFNAME in the same netns right after works and
// carries traffic; the tombstones go once the deferred deletion ran, and
// the new attachment keeps working after that.
func TestDelTombstoneReAdd(t *testing.T) {
	e := newEnv(t, "10.244.23.0/24")
	startAgent(e, func(c *agent.Config) { c.Linux.TeardownDelay = 3 * time.Second })
	gw := netip.MustParseAddr("10.244.23.1")
	peer := e.NewPod("deldefer-peer")
	peerIP := podIP(t, e.MustAdd(peer), peer, gw)
	p := e.NewPod("deldefer")
	first := podIP(t, e.MustAdd(p), p, gw)
	if !ping(p, peerIP) {
		t.Fatal("no traffic before DEL")
	}
	if err := e.Del(p); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if hostLinkExists(t, e, p) {
		t.Fatal("the host veth's name is still taken after DEL")
	}
	if _, err := p.NS.Netlink(t).LinkByName("eth0"); err == nil {
		t.Fatal("eth0 still in the pod's netns after DEL")
	}
	if n, m := len(nodeharness.Tombstones(t, e.NS)), len(nodeharness.Tombstones(t, p.NS)); n != 1 || m != 1 {
		t.Fatalf("tombstones after DEL: %d in the host, %d in the pod; want the pair's two, deletion pending", n, m)
	}
	if n := plainMetric(t, e, "membrane_veth_teardowns_pending"); n != 1 {
		t.Fatalf("membrane_veth_teardowns_pending = %v after DEL, want 1", n)
	}
	if err := e.Del(p); err != nil { // idempotent, while the deletion is pending
		t.Fatalf("second DEL: %v", err)
	}
	second := podIP(t, e.MustAdd(p), p, gw)
	t.Logf("address before the DEL %s, after %s", first, second)
	verifyPod(t, p, second, gw)
	if !ping(p, peerIP) || !ping(peer, second) {
		t.Fatalf("no traffic after the ADD that followed the DEL (first %s, now %s)", first, second)
	}
	testutil.Eventually(t, "the tombstones to go", func() bool {
		return len(nodeharness.Tombstones(t, e.NS)) == 0 && len(nodeharness.Tombstones(t, p.NS)) == 0
	})
	if !ping(p, peerIP) || !ping(peer, second) {
		t.Fatal("no traffic after the old pair's deferred deletion")
	}
	// The deletion job counts itself done after the kernel deleted the
	// pair: the links go first.
	testutil.EventuallyErr(t, "the pending teardown counted done", func() error {
		if n := plainMetric(t, e, "membrane_veth_teardowns_pending"); n != 0 {
			return fmt.Errorf("membrane_veth_teardowns_pending = %v once the tombstones went, want 0", n)
		}
		return nil
	})
	if err := e.Check(p); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	if err := e.Del(p); err != nil {
		t.Fatal(err)
	}
	if err := p.NS.Remove(); err != nil {
		t.Fatal(err)
	}
	if err := e.Del(p); err != nil { // the netns gone
		t.Fatalf("DEL after the netns went: %v", err)
	}
}

// udpPasses reports whether a datagram sent from one netns to addr:port
// arrives at a socket bound there in the other, within a second.
func udpPasses(t *testing.T, from, to *nodeharness.Pod, addr netip.Addr) bool {
	t.Helper()
	var rx *net.UDPConn
	if err := to.NS.Do(func() error {
		var err error
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: addr.AsSlice(), Port: 7777})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	if err := from.NS.Do(func() error {
		tx, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: addr.AsSlice(), Port: 7777})
		if err != nil {
			return nil // no route: nothing passes
		}
		defer tx.Close()
		for range 3 {
			_, _ = tx.Write([]byte("deleted?"))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_ = rx.SetReadDeadline(time.Now().Add(time.Second))
	_, _, err := rx.ReadFromUDP(make([]byte, 64))
	return err == nil
}

// TestDeletedPodCutOff: once the agent answered an endpoint's DELETE, the
// pod's traffic is dropped each way, even while its pod end is still up
// with its address (the plugin has not run yet) and the pair's deletion
// is pending.
func TestDeletedPodCutOff(t *testing.T) {
	e := newEnv(t, "10.244.24.0/24")
	startAgent(e, func(c *agent.Config) { c.Linux.TeardownDelay = time.Hour })
	gw := netip.MustParseAddr("10.244.24.1")
	peer := e.NewPod("cutoff-peer")
	peerIP := podIP(t, e.MustAdd(peer), peer, gw)
	p := e.NewPod("cutoff")
	ip := podIP(t, e.MustAdd(p), p, gw)
	if !udpPasses(t, p, peer, peerIP) || !udpPasses(t, peer, p, ip) {
		t.Fatal("no traffic before the DELETE")
	}
	if err := e.Client().EndpointDeleteByContainer(context.Background(), p.RT.ContainerID); err != nil {
		t.Fatal(err)
	}
	if udpPasses(t, p, peer, peerIP) {
		t.Fatal("the deleted pod reached its peer after the DELETE answered")
	}
	if udpPasses(t, peer, p, ip) {
		t.Fatal("the peer reached the deleted pod after the DELETE answered")
	}
	if err := e.Del(p); err != nil {
		t.Fatal(err)
	}
}

// TestDelTombstoneSameAddress: in a range of one pod address, the ADD
// after a DEL gets the address the pod end's tombstone in the same netns
// still holds (down); the new eth0 carries traffic before and after the
// tombstone's deletion.
func TestDelTombstoneSameAddress(t *testing.T) {
	e := newEnv(t, "10.244.25.0/30")
	startAgent(e, func(c *agent.Config) { c.Linux.TeardownDelay = 2 * time.Second })
	gw := netip.MustParseAddr("10.244.25.1")
	p := e.NewPod("sameaddr")
	first := podIP(t, e.MustAdd(p), p, gw)
	if err := e.Del(p); err != nil {
		t.Fatal(err)
	}
	if n := len(nodeharness.Tombstones(t, p.NS)); n != 1 {
		t.Fatalf("%d tombstones in the pod's netns after DEL, want 1", n)
	}
	second := podIP(t, e.MustAdd(p), p, gw)
	if second != first {
		t.Fatalf("address after the DEL %s, want %s again (a range of one)", second, first)
	}
	if !ping(p, gw) {
		t.Fatal("no traffic beside the tombstone holding the same address")
	}
	testutil.Eventually(t, "the tombstones to go", func() bool {
		return len(nodeharness.Tombstones(t, e.NS)) == 0 && len(nodeharness.Tombstones(t, p.NS)) == 0
	})
	verifyPod(t, p, second, gw)
	if !ping(p, gw) {
		t.Fatal("no traffic after the tombstone holding the same address went")
	}
	if err := e.Del(p); err != nil {
		t.Fatal(err)
	}
}
