package sim

import (
	"io"
	"log/slog"
	"net/netip"
	"sort"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// settledSnapshot is a consistent deep snapshot of a settled agent with
// two endpoints sharing identity 300.
func settledSnapshot(tb testing.TB) (*Snapshot, map[string]expectedPod) {
	tb.Helper()
	ls, err := labels.ParseSet(podLabels(3))
	if err != nil {
		tb.Fatal(err)
	}
	s := &Snapshot{PoolSize: map[string]int{"ipv4": 254}, Pool: &actors.PoolStats{Workers: 4},
		Realized: map[endpoint.ID]uint64{}, LeftToGC: map[endpoint.ID]bool{}}
	want := map[string]expectedPod{}
	for i, id := range []endpoint.ID{1, 2} {
		k := makeKey(int32(i), 1)
		ip := netip.AddrFrom4([4]byte{10, 0, 0, byte(10 + i)})
		pid := "agent/endpoints/ep-" + string(rune('0'+id))
		s.Endpoints = append(s.Endpoints, &endpoint.Endpoint{ID: id, ContainerID: k.containerID(), Namespace: simNamespace,
			PodName: k.podName(), Labels: ls, IPv4: ip, State: endpoint.StateReady, Identity: 300, RealizedRevision: 2})
		s.IPs = append(s.IPs, &index.IP{IP: ip, Family: "ipv4", Owner: k.owner(), Endpoint: id, Holder: pid})
		s.Leases = append(s.Leases, &index.IdentityLease{ID: 300, Holder: pid})
		s.Actors = append(s.Actors, actors.ActorInfo{PID: pid, Endpoint: id})
		s.Realized[id] = 2
		want[k.containerID()] = expectedPod{ip: ip, labels: podLabels(3)}
	}
	s.Identities = []*index.Identity{{ID: 300, Labels: ls, Key: ls.Key(), RefCount: 2}}
	return s, want
}

func invariants(fs []finding) []string {
	var out []string
	seen := map[string]bool{}
	for _, f := range fs {
		if !seen[f.inv] {
			seen[f.inv] = true
			out = append(out, f.inv)
		}
	}
	sort.Strings(out)
	return out
}

func TestQuiescentChecks(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(s *Snapshot, want map[string]expectedPod)
		want   []string // invariants found, sorted
	}{
		{name: "consistent", mutate: func(*Snapshot, map[string]expectedPod) {}},
		{name: "address used twice", mutate: func(s *Snapshot, _ map[string]expectedPod) {
			s.Endpoints[1].IPv4 = s.Endpoints[0].IPv4
		}, want: []string{invEndpointDiffers, invIndexActors, invIPLeaked, invIPOwnedTwice}},
		{name: "address allocated to another pod", mutate: func(s *Snapshot, _ map[string]expectedPod) {
			s.IPs[0].Owner = "sim/p99-1"
		}, want: []string{invIPOwnedTwice}},
		{name: "address free in IPAM", mutate: func(s *Snapshot, _ map[string]expectedPod) {
			s.IPs = s.IPs[1:]
		}, want: []string{invIPAMAccounting}},
		{name: "pool overcommitted", mutate: func(s *Snapshot, _ map[string]expectedPod) {
			s.PoolSize["ipv4"] = 1
		}, want: []string{invIPAMAccounting}},
		{name: "refcount above the leases", mutate: func(s *Snapshot, _ map[string]expectedPod) {
			s.Identities[0].RefCount = 3
		}, want: []string{invIdentity}},
		{name: "lease of an unknown identity", mutate: func(s *Snapshot, _ map[string]expectedPod) {
			s.Leases = append(s.Leases, &index.IdentityLease{ID: 999, Holder: "x"})
		}, want: []string{invIdentity}},
		{name: "identity of other labels", mutate: func(s *Snapshot, _ map[string]expectedPod) {
			other, _ := labels.ParseSet([]string{"k8s:app=other"})
			s.Identities[0].Labels = other
		}, want: []string{invIdentity}},
		{name: "endpoint without actor", mutate: func(s *Snapshot, _ map[string]expectedPod) {
			s.Actors = s.Actors[:1]
		}, want: []string{invIndexActors}},
		{name: "actor without endpoint", mutate: func(s *Snapshot, _ map[string]expectedPod) {
			s.Actors = append(s.Actors, actors.ActorInfo{PID: "agent/endpoints/ep-9", Endpoint: 9})
		}, want: []string{invIndexActors}},
		{name: "mailbox not empty", mutate: func(s *Snapshot, _ map[string]expectedPod) {
			s.Actors[0].Mailbox = 3
		}, want: []string{invIndexActors}},
		{name: "lease held by someone else", mutate: func(s *Snapshot, _ map[string]expectedPod) {
			s.Leases[0].Holder = "agent/endpoints/ep-7"
		}, want: []string{invIndexActors}},
		{name: "not ready", mutate: func(s *Snapshot, _ map[string]expectedPod) {
			s.Endpoints[0].State = endpoint.StateWaitingToRegenerate
		}, want: []string{invNotReady}},
		{name: "acknowledged endpoint lost", mutate: func(s *Snapshot, want map[string]expectedPod) {
			want["sim-5-1"] = expectedPod{ip: netip.MustParseAddr("10.0.0.50")}
		}, want: []string{invEndpointLost}},
		{name: "deleted endpoint still there", mutate: func(s *Snapshot, want map[string]expectedPod) {
			delete(want, s.Endpoints[0].ContainerID)
		}, want: []string{invDeleteUndone}},
		{name: "labels differ", mutate: func(s *Snapshot, want map[string]expectedPod) {
			w := want[s.Endpoints[0].ContainerID]
			w.labels = podLabels(4)
			want[s.Endpoints[0].ContainerID] = w
		}, want: []string{invEndpointDiffers}},
		{name: "datapath at an old revision", mutate: func(s *Snapshot, _ map[string]expectedPod) {
			s.Realized[1] = 1
		}, want: []string{invDatapath}},
		{name: "datapath leftover", mutate: func(s *Snapshot, _ map[string]expectedPod) {
			s.Realized[7] = 1
		}, want: []string{invDatapath}},
		{name: "datapath leftover handed to GC", mutate: func(s *Snapshot, _ map[string]expectedPod) {
			s.Realized[7], s.LeftToGC[7] = 1, true
		}},
		{name: "address allocated, no endpoint", mutate: func(s *Snapshot, _ map[string]expectedPod) {
			s.IPs = append(s.IPs, &index.IP{IP: netip.MustParseAddr("10.0.0.99"), Family: "ipv4", Owner: "sim/p9-1"})
		}, want: []string{invIPLeaked}},
		{name: "work pending", mutate: func(s *Snapshot, _ map[string]expectedPod) {
			s.Pool.Backlog = 2
		}, want: []string{invDeleteQueue}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, want := settledSnapshot(t)
			tt.mutate(s, want)
			got := invariants(quiescentChecks(s, want))
			if len(got) != len(tt.want) {
				t.Fatalf("found %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("found %v, want %v", got, tt.want)
				}
			}
		})
	}
}

// TestMidChecks: states that exist while messages are in flight (an
// endpoint not yet claiming its address, not ready) are not mid-run
// findings; states that break an invariant at any instant are.
func TestMidChecks(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(s *Snapshot)
		want   []string
	}{
		{name: "not claimed yet", mutate: func(s *Snapshot) { s.IPs[0].Endpoint, s.IPs[0].Holder = 0, "" }},
		{name: "not ready, no actor info", mutate: func(s *Snapshot) { s.Endpoints[0].State = endpoint.StateRegenerating; s.Actors = nil }},
		{name: "claim of a deleted endpoint", mutate: func(s *Snapshot) { s.Endpoints = s.Endpoints[1:] }, want: []string{invIPLeaked}},
		{name: "two endpoints on one address", mutate: func(s *Snapshot) { s.Endpoints[1].IPv4 = s.Endpoints[0].IPv4 }, want: []string{invIPOwnedTwice}},
		{name: "refcount", mutate: func(s *Snapshot) { s.Identities[0].RefCount = 1 }, want: []string{invIdentity}},
		{name: "identity gone with leases", mutate: func(s *Snapshot) { s.Identities = nil }, want: []string{invIdentity}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := settledSnapshot(t)
			tt.mutate(s)
			got := invariants(midChecks(s))
			if len(got) != len(tt.want) || (len(got) > 0 && got[0] != tt.want[0]) {
				t.Fatalf("found %v, want %v", got, tt.want)
			}
		})
	}
}

// TestMidCheckStreaks: mid-run, a finding becomes a violation once it
// lasts two consecutive samples, except a claim of an endpoint no longer
// in the index (rows of two actors, the IPAM's and the endpoint's): that
// needs claimSamples, and a shorter run is kept as a transient. A
// finding that goes away starts over.
func TestMidCheckStreaks(t *testing.T) {
	e := &engine{viol: newViolations(), log: slog.New(slog.NewTextHandler(io.Discard, nil)), start: time.Now(),
		m: newModel(16, netip.MustParsePrefix("10.0.0.0/24"), time.Now())}
	s := &sampler{seen: map[string]int{}}
	deleted, _ := settledSnapshot(t)
	deleted.Endpoints = deleted.Endpoints[1:] // its address still claimed
	clean, _ := settledSnapshot(t)
	for i := 1; i < claimSamples; i++ {
		e.midCheck(deleted, s)
	}
	if e.viol.total != 0 {
		t.Fatalf("a claim of a deleted endpoint for %d samples is a violation", claimSamples-1)
	}
	e.midCheck(clean, s) // the IPAM caught up
	e.midCheck(deleted, s)
	if e.viol.total != 0 || e.transients[invIPLeaked] != claimSamples-1 {
		t.Fatalf("after a gap: %d violations, transients %v; want 0 and %d", e.viol.total, e.transients, claimSamples-1)
	}
	for i := 1; i < claimSamples; i++ {
		e.midCheck(deleted, s)
	}
	if e.viol.byInv[invIPLeaked] != 1 {
		t.Fatalf("a claim of a deleted endpoint for %d samples: violations %v, want one %s", claimSamples, e.viol.byInv, invIPLeaked)
	}
	twice, _ := settledSnapshot(t)
	twice.Endpoints[1].IPv4 = twice.Endpoints[0].IPv4
	e.midCheck(twice, s)
	e.midCheck(twice, s)
	if e.viol.byInv[invIPOwnedTwice] == 0 {
		t.Fatalf("an address used twice for two samples: violations %v, want %s", e.viol.byInv, invIPOwnedTwice)
	}
}
