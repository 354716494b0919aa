package crash

import (
	"context"
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

// TestCrashBetweenDelAndTeardown: the agent is SIGKILLed after it
// answered a DEL and before the pair's deferred deletion ran (a
// teardown delay of an hour), with the runtime keeping the pod's netns.
// The next agent deletes both tombstones, the address stays released,
// and an ADD of the same attachment in the same netns works.
func TestCrashBetweenDelAndTeardown(t *testing.T) {
	n := nodeharness.New(t, nodeharness.Options{Prefix: "mbc-host", IPv4Range: "10.252.9.0/24", Network: "crash-linux", MTU: 1400, OwnBPFFS: true})
	slow := n.Process("--teardown-delay", "1h", "--gc-interval", "1h")
	slow.Start()
	p := n.NewPod("tomb")
	res := n.MustAdd(p)
	first, _ := netip.AddrFromSlice(res.IPs[0].Address.IP.To4())
	if err := n.Del(p); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if h, c := len(nodeharness.Tombstones(t, n.NS)), len(nodeharness.Tombstones(t, p.NS)); h != 1 || c != 1 {
		t.Fatalf("tombstones after DEL: %d in the host, %d in the pod; want one each", h, c)
	}
	slow.Kill()

	// The GC's interval is long: what deletes them is the start's sweep.
	next := n.Process("--teardown-delay", "100ms", "--gc-interval", "1h")
	next.Start()
	testutil.Eventually(t, "the tombstones left by the killed agent to go", func() bool {
		return len(nodeharness.Tombstones(t, n.NS)) == 0 && len(nodeharness.Tombstones(t, p.NS)) == 0
	})
	st, err := n.Client().IPAMStatus(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range st.IPv4.Allocations {
		if a.IP == first.String() {
			t.Fatalf("the deleted pod's address %s is allocated again after the restart: %+v", first, a)
		}
	}
	again := n.MustAdd(p)
	gw := netip.MustParseAddr("10.252.9.1")
	if out, err := p.NS.Exec("ping", "-c", "1", "-W", "5", gw.String()); err != nil {
		t.Fatalf("ping the gateway after the ADD (%s): %v\n%s", again.IPs[0].Address.IP, err, out)
	}
	if err := n.Del(p); err != nil {
		t.Fatal(err)
	}
}
