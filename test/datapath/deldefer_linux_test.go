package datapath_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/domain/ifname"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

// tombstones returns the names of the tombstone links (ifname.Tombstone)
// in ns.
func tombstones(t *testing.T, ns *testutil.NS) []string {
	t.Helper()
	links, err := ns.Netlink(t).LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range links {
		if ifname.IsTombstone(l.Attrs().Name) {
			names = append(names, l.Attrs().Name)
		}
	}
	return names
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
	if n, m := len(tombstones(t, e.NS)), len(tombstones(t, p.NS)); n != 1 || m != 1 {
		t.Fatalf("tombstones after DEL: %d in the host, %d in the pod; want the pair's two, deletion pending", n, m)
	}
	if err := e.Del(p); err != nil { // idempotent, while the deletion is pending
		t.Fatalf("second DEL: %v", err)
	}
	second := podIP(t, e.MustAdd(p), p, gw)
	verifyPod(t, p, second, gw)
	if !ping(p, peerIP) || !ping(peer, second) {
		t.Fatalf("no traffic after the ADD that followed the DEL (first %s, now %s)", first, second)
	}
	testutil.Eventually(t, "the tombstones to go", func() bool {
		return len(tombstones(t, e.NS)) == 0 && len(tombstones(t, p.NS)) == 0
	})
	if !ping(p, peerIP) || !ping(peer, second) {
		t.Fatal("no traffic after the old pair's deferred deletion")
	}
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

// TestDeletedPodCutOff: once the agent answered an endpoint's DELETE, the
// pod's traffic is dropped both ways even while its pod end is still up
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
	if !ping(p, peerIP) || !ping(peer, ip) {
		t.Fatal("no traffic before the DELETE")
	}
	if err := e.Client().EndpointDeleteByContainer(context.Background(), p.RT.ContainerID); err != nil {
		t.Fatal(err)
	}
	if ping(p, peerIP) {
		t.Fatal("the deleted pod reached its peer after the DELETE answered")
	}
	if ping(peer, ip) {
		t.Fatal("the peer reached the deleted pod after the DELETE answered")
	}
	if err := e.Del(p); err != nil {
		t.Fatal(err)
	}
}
