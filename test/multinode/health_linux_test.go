package multinode

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestNodeHealth is cross-node health (issue 37) and the partition of
// issue 38: every agent probes every other node's addresses (ICMP echo,
// HTTP to its responder on port 4240) and GET /v1/health shows the
// matrix with latencies. A node whose underlay link goes down is shown
// unreachable by the others, named in their status, and announced by a
// node-health event; once the link is back it is ok again.
func TestNodeHealth(t *testing.T) {
	c := newClusterWith(t, "native", 3, 79, []string{"--enable-health=true", "--health-node-interval", "300ms"})
	a, cut := c.nodes[0], c.nodes[2]
	matrix := func(nd *node) map[string]models.NodeHealth {
		h, err := nd.api.Health(context.Background())
		if err != nil {
			t.Fatalf("%s: GET /v1/health: %v", nd.name, err)
		}
		out := map[string]models.NodeHealth{}
		for _, n := range h.Nodes {
			out[n.Name] = n
		}
		return out
	}
	for _, nd := range c.nodes {
		testutil.EventuallyErr(t, nd.name+" seeing every other node ok over both families", func() error {
			m := matrix(nd)
			for _, other := range c.nodes {
				if other == nd {
					continue
				}
				n, ok := m[other.name]
				if !ok || n.State != "ok" || len(n.Addresses) != 2 {
					return fmt.Errorf("%s: %+v", other.name, n)
				}
				for _, ad := range n.Addresses {
					if !ad.ICMP.OK || !ad.HTTP.OK || ad.ICMP.LatencyMS <= 0 || ad.HTTP.LatencyMS <= 0 {
						return fmt.Errorf("%s %s: %+v", other.name, ad.IP, ad)
					}
				}
			}
			return nil
		})
	}
	h, err := a.api.Health(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s's view: %+v", a.name, h.Nodes)

	eth0, err := cut.nl.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	// The link keeps its IPv6 addresses while down (Linux drops them by
	// default), as a cable pulled out of a node would.
	if _, err := cut.ns.Exec("sysctl", "-qw", "net.ipv6.conf.eth0.keep_addr_on_down=1"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	evs := make(chan events.Event, 16)
	go func() {
		_ = a.api.Events(ctx, url.Values{"type": {string(events.NodeHealth)}}, func(e events.Event) bool {
			select {
			case evs <- e:
			default:
			}
			return true
		})
	}()
	time.Sleep(200 * time.Millisecond) // the stream is subscribed (an event before it would be missed, failing the test, not passing it)
	down := time.Now()
	if err := cut.nl.LinkSetDown(eth0); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyErr(t, a.name+" seeing "+cut.name+" unreachable", func() error {
		m := matrix(a)
		if n := m[cut.name]; n.State != "unreachable" {
			return fmt.Errorf("%s: %+v", cut.name, n)
		}
		if n := m[c.nodes[1].name]; n.State != "ok" {
			return fmt.Errorf("%s (not cut): %+v", c.nodes[1].name, n)
		}
		return nil
	})
	t.Logf("%s unreachable in %s's view %s after its link went down", cut.name, a.name, time.Since(down).Round(time.Millisecond))
	st, err := a.api.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Health == nil || st.Health.NodesProbed != 2 || !slices.Equal(st.Health.FailingNodes, []string{cut.name}) {
		t.Errorf("status health %+v: want 2 nodes probed, %s failing", st.Health, cut.name)
	}
	var ev *events.Event
	wait := time.After(10 * time.Second)
	for ev == nil {
		select {
		case e := <-evs:
			if e.Node == cut.name && e.State == "unreachable" {
				ev = &e
			}
		case <-wait:
			t.Fatalf("no node-health event for %s unreachable", cut.name)
		}
	}
	t.Logf("event: %s", ev.Message)

	if err := cut.nl.LinkSetUp(eth0); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyErr(t, a.name+" seeing "+cut.name+" ok again", func() error {
		if n := matrix(a)[cut.name]; n.State != "ok" {
			return fmt.Errorf("%+v", n)
		}
		return nil
	})
}
