package kvstore_test

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// lookupSource is a fakeSource counting the lookups of one endpoint.
type lookupSource struct {
	*fakeSource
	id      endpoint.ID
	lookups atomic.Int64
}

func (s *lookupSource) Endpoint(id endpoint.ID) (*endpoint.Endpoint, bool) {
	if id == s.id {
		s.lookups.Add(1)
	}
	return s.fakeSource.Endpoint(id)
}

// TestPublisherIndexLagsEvent: the agent publishes an endpoint's event
// before its index commits the change; the publisher, woken by the event,
// finds the index not saying it yet. It looks again shortly (the
// endpoint is written once the index holds it) instead of leaving it to
// the full comparison FullEvery later (a second by default: under load,
// the p99 of the time from an endpoint's creation to its record in etcd
// was that second; here FullEvery is an hour).
func TestPublisherIndexLagsEvent(t *testing.T) {
	srv := startEtcd(t)
	c := connect(t, srv.Endpoint, "lag-a", nil)
	src := &lookupSource{fakeSource: newFakeSource(), id: 7}
	pub, err := kvstore.StartPublisher(c, kvstore.PublisherConfig{Source: src, Hub: src.hub,
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")},
		Coalesce: 5 * time.Millisecond, Resync: time.Hour, FullEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Stop)
	testutil.Eventually(t, "the node record published", func() bool { return pub.Stats().Published == 1 })

	// The event first; the index does not hold the endpoint yet.
	src.hub.Publish(events.Event{Type: events.EndpointStateChanged, Endpoint: 7, State: string(endpoint.StateReady), Identity: 300})
	testutil.Eventually(t, "the publisher looked the endpoint up", func() bool { return src.lookups.Load() > 0 })
	// Now the index commits it (no event: the one above was its).
	src.mu.Lock()
	src.eps[7] = &endpoint.Endpoint{ID: 7, IPv4: podIP(0, 7), Identity: 300, State: endpoint.StateReady}
	src.mu.Unlock()
	testutil.Eventually(t, "the endpoint published once the index holds it", func() bool { return pub.Stats().Published == 2 })
}
