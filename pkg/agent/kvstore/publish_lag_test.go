package kvstore_test

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// commitOnLookup is a fakeSource whose index commits a pending change of
// one endpoint right after the first lookup of it has read the row
// before it: the commit lands while the publisher compares.
type commitOnLookup struct {
	*fakeSource
	id      endpoint.ID
	once    sync.Once
	commit  func()
	lookups chan struct{}
}

func (s *commitOnLookup) Endpoint(id endpoint.ID) (*endpoint.Endpoint, bool) {
	ep, ok := s.fakeSource.Endpoint(id)
	if id == s.id {
		s.once.Do(func() { s.commit(); close(s.lookups) })
	}
	return ep, ok
}

// TestPublisherIndexLagsEvent: the agent publishes an endpoint's event
// before its index commits the change; the publisher, woken by the event,
// reads the row before the commit (the endpoint still waits for its
// identity) and the commit lands while it writes. It compares the
// endpoint again shortly instead of leaving it to the full comparison
// FullEvery later (a second by default: under load, the time from an
// endpoint's creation to its record in etcd had a one-second mode, one
// endpoint in ten at 30 simulated nodes; here FullEvery is an hour).
// Whether the row lagged is judged on the read the comparison used: read
// again after the write, the row says the endpoint is ready.
func TestPublisherIndexLagsEvent(t *testing.T) {
	srv := startEtcd(t)
	c := connect(t, srv.Endpoint, "lag-a", nil)
	src := &commitOnLookup{fakeSource: newFakeSource(), id: 7, lookups: make(chan struct{})}
	src.eps[7] = &endpoint.Endpoint{ID: 7, IPv4: podIP(0, 7), State: endpoint.StateWaitingForIdentity}
	src.commit = func() {
		src.mu.Lock()
		src.eps[7] = &endpoint.Endpoint{ID: 7, IPv4: podIP(0, 7), Identity: 300, State: endpoint.StateReady}
		src.mu.Unlock()
	}
	pub, err := kvstore.StartPublisher(c, kvstore.PublisherConfig{Source: src, Hub: src.hub,
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")},
		Coalesce: 5 * time.Millisecond, Resync: time.Hour, FullEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Stop)
	testutil.Eventually(t, "the node record published", func() bool { return pub.Stats().Published == 1 })

	src.hub.Publish(events.Event{Type: events.EndpointStateChanged, Endpoint: 7, State: string(endpoint.StateReady), Identity: 300})
	<-src.lookups
	testutil.Eventually(t, "the endpoint published once the index holds it", func() bool { return pub.Stats().Published == 2 })
}
