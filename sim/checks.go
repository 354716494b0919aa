package sim

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
)

// finding is a possible violation from one snapshot. Mid-run findings
// count only when the same key is found in consecutive snapshots: two,
// or claimSamples for a claim of a deleted endpoint (midSamples).
type finding struct {
	inv string
	key string // the subject: "ip 10.0.0.2", "endpoint 7", "identity 300"
	cid string // the pod's container ID, when the subject is an endpoint
	msg string
}

// claimKey prefixes the key of a claim of an endpoint no longer in the
// index.
const claimKey = "claim of "

// midSamples is how many consecutive snapshots make a mid-run finding a
// violation.
func midSamples(f finding) int {
	if strings.HasPrefix(f.key, claimKey) {
		return claimSamples
	}
	return 2
}

// claimSamples is how many consecutive snapshots (seconds) a claim of an
// endpoint no longer in the index must last to be a leak mid-run. The
// endpoint leaves the index first and ends its IP lease after the
// index's commit answers it: the reply crosses the endpoint actor's
// mailbox, the IPAMUnclaim the IPAM actor's, and IPAM's row change the
// index writer's batch, so under churn the claim outlives its endpoint
// by more than a second (the soak with 2,000 endpoints saw it; two rows
// written by different actors, not one transaction). A real leak stays
// and the quiescent checks find it whatever its age.
const claimSamples = 5

func epName(ep *endpoint.Endpoint) string {
	if ep.ContainerID == "" {
		return "endpoint " + strconv.Itoa(int(ep.ID))
	}
	return fmt.Sprintf("endpoint %d (%s)", ep.ID, ep.ContainerID)
}

// midChecks are the invariants that hold at every instant, in flight or
// not: they only compare rows one actor writes in one transaction, or
// states that last no longer than a message round trip (or, where rows
// of two actors meet, no longer than claimSamples seconds).
func midChecks(s *Snapshot) []finding {
	var out []finding
	byID := make(map[endpoint.ID]*endpoint.Endpoint, len(s.Endpoints))
	byIP := make(map[netip.Addr]*endpoint.Endpoint, len(s.Endpoints))
	for _, ep := range s.Endpoints {
		byID[ep.ID] = ep
		for _, ip := range []netip.Addr{ep.IPv4, ep.IPv6} {
			if !ip.IsValid() {
				continue
			}
			if other, ok := byIP[ip]; ok {
				out = append(out, finding{invIPOwnedTwice, "ip " + ip.String(), ep.ContainerID,
					fmt.Sprintf("%s and %s both use %s", epName(other), epName(ep), ip)})
			}
			byIP[ip] = ep
		}
	}
	rows := make(map[netip.Addr]*index.IP, len(s.IPs))
	used := map[string]int{}
	for _, r := range s.IPs {
		rows[r.IP] = r
		used[r.Family]++
		out = append(out, claimFindings(r, byID)...)
	}
	for fam, size := range s.PoolSize {
		if used[fam] > size {
			out = append(out, finding{invIPAMAccounting, "pool " + fam, "",
				fmt.Sprintf("%s: %d addresses used in a pool of %d (used + free != size)", fam, used[fam], size)})
		}
	}
	for ip, ep := range byIP {
		if _, ok := rows[ip]; !ok {
			out = append(out, finding{invIPAMAccounting, "ip " + ip.String(), ep.ContainerID,
				fmt.Sprintf("%s uses %s, which IPAM holds as free", epName(ep), ip)})
		}
	}
	return append(out, refcountFindings(s)...)
}

// claimFindings checks an IPAM row claimed by an endpoint.
func claimFindings(r *index.IP, byID map[endpoint.ID]*endpoint.Endpoint) []finding {
	if r.Endpoint == 0 {
		return nil
	}
	ep, ok := byID[r.Endpoint]
	key := "ip " + r.IP.String()
	switch {
	case !ok:
		return []finding{{invIPLeaked, fmt.Sprintf("%s%s by endpoint %d", claimKey, key, r.Endpoint), "",
			fmt.Sprintf("%s is claimed by endpoint %d, which is not in the index", r.IP, r.Endpoint)}}
	case ep.IPv4 != r.IP && ep.IPv6 != r.IP:
		return []finding{{invIPOwnedTwice, key, ep.ContainerID, fmt.Sprintf("%s is claimed by %s, which uses %s", r.IP, epName(ep), ep.IPv4)}}
	case ep.PodKey() != "" && r.Owner != ep.PodKey():
		return []finding{{invIPOwnedTwice, key, ep.ContainerID,
			fmt.Sprintf("%s is allocated to %s but claimed by %s of pod %s", r.IP, r.Owner, epName(ep), ep.PodKey())}}
	}
	return nil
}

// refcountFindings: every identity's refcount is its number of leases,
// and every lease names an identity. The identity actor writes both in
// one transaction.
func refcountFindings(s *Snapshot) []finding {
	var out []finding
	leases := map[identity.NumericIdentity]int{}
	for _, l := range s.Leases {
		leases[l.ID]++
	}
	known := map[identity.NumericIdentity]bool{}
	for _, row := range s.Identities {
		known[row.ID] = true
		if row.RefCount < 1 || row.RefCount != leases[row.ID] {
			out = append(out, finding{invIdentity, "identity " + strconv.Itoa(int(row.ID)), "",
				fmt.Sprintf("identity %d (%s) has refcount %d and %d leases", row.ID, row.Labels, row.RefCount, leases[row.ID])})
		}
	}
	for id, n := range leases {
		if !known[id] {
			out = append(out, finding{invIdentity, "identity " + strconv.Itoa(int(id)), "",
				fmt.Sprintf("%d leases name identity %d, which does not exist", n, id)})
		}
	}
	return out
}

// leaseKey is an identity lease: identity and holder PID.
type leaseKey struct {
	id     identity.NumericIdentity
	holder string
}

// expectedPod is what the harness expects of a live pod's endpoint.
type expectedPod struct {
	ip     netip.Addr
	labels []string
}

// quiescentChecks compare a deep snapshot of a settled agent with the
// pods the harness holds live (by container ID): everything midChecks
// does, plus the index against the actors, identities against endpoints,
// the datapath against the index and nothing pending.
func quiescentChecks(s *Snapshot, want map[string]expectedPod) []finding {
	out := midChecks(s)
	actorOf := make(map[endpoint.ID]actors.ActorInfo, len(s.Actors))
	for _, a := range s.Actors {
		actorOf[a.Endpoint] = a
		if a.Mailbox > 0 {
			out = append(out, finding{invIndexActors, "endpoint " + strconv.Itoa(int(a.Endpoint)), "",
				fmt.Sprintf("actor %s holds %d messages at quiescence", a.PID, a.Mailbox)})
		}
	}
	rows := make(map[netip.Addr]*index.IP, len(s.IPs))
	for _, r := range s.IPs {
		rows[r.IP] = r
	}
	idRows := make(map[identity.NumericIdentity]*index.Identity, len(s.Identities))
	for _, row := range s.Identities {
		idRows[row.ID] = row
	}
	leases := make(map[leaseKey]bool, len(s.Leases))
	for _, l := range s.Leases {
		leases[leaseKey{l.ID, l.Holder}] = true
	}
	inIndex := make(map[endpoint.ID]bool, len(s.Endpoints))
	perIdentity := map[identity.NumericIdentity]int{}
	claimed := map[netip.Addr]bool{}
	for _, ep := range s.Endpoints {
		inIndex[ep.ID] = true
		perIdentity[ep.Identity]++
		claimed[ep.IPv4], claimed[ep.IPv6] = true, true
		info, hasActor := actorOf[ep.ID]
		out = append(out, endpointFindings(s, ep, info, hasActor, rows, idRows, leases, want)...)
	}
	out = append(out, missingFindings(s, want)...)
	for _, a := range s.Actors {
		if !inIndex[a.Endpoint] {
			out = append(out, finding{invIndexActors, "endpoint " + strconv.Itoa(int(a.Endpoint)), "",
				fmt.Sprintf("actor %s has no endpoint in the index", a.PID)})
		}
	}
	for _, r := range s.IPs {
		if !claimed[r.IP] {
			out = append(out, finding{invIPLeaked, "ip " + r.IP.String(), "",
				fmt.Sprintf("%s is allocated to %q but no endpoint uses it", r.IP, r.Owner)})
		}
	}
	for _, row := range s.Identities {
		if n := perIdentity[row.ID]; n != row.RefCount {
			out = append(out, finding{invIdentity, "identity " + strconv.Itoa(int(row.ID)), "",
				fmt.Sprintf("identity %d has refcount %d but %d endpoints", row.ID, row.RefCount, n)})
		}
	}
	return append(out, settledFindings(s, inIndex)...)
}

// endpointFindings checks one endpoint of a settled agent.
func endpointFindings(s *Snapshot, ep *endpoint.Endpoint, info actors.ActorInfo, hasActor bool, rows map[netip.Addr]*index.IP,
	idRows map[identity.NumericIdentity]*index.Identity, leases map[leaseKey]bool, want map[string]expectedPod) []finding {
	var out []finding
	key, name := "endpoint "+strconv.Itoa(int(ep.ID)), epName(ep)
	add := func(inv, format string, args ...any) {
		out = append(out, finding{inv, key, ep.ContainerID, name + ": " + fmt.Sprintf(format, args...)})
	}
	if !hasActor {
		add(invIndexActors, "in the index without an actor")
	}
	if ep.State != endpoint.StateReady {
		add(invNotReady, "state %s at quiescence (last error %q)", ep.State, ep.LastError)
	}
	if w, ok := want[ep.ContainerID]; !ok {
		add(invDeleteUndone, "exists, but no live pod accounts for it (its DEL was acknowledged, or its ADD failed)")
	} else {
		if ep.IPv4 != w.ip {
			add(invEndpointDiffers, "address %s, acknowledged %s", ep.IPv4, w.ip)
		}
		if got := ep.Labels.Strings(); !slices.Equal(got, w.labels) {
			add(invEndpointDiffers, "labels %v, acknowledged %v", got, w.labels)
		}
	}
	if r := rows[ep.IPv4]; ep.IPv4.IsValid() && r != nil && hasActor && (r.Endpoint != ep.ID || r.Holder != info.PID) {
		add(invIndexActors, "IPAM row of %s names endpoint %d held by %q, not actor %s", ep.IPv4, r.Endpoint, r.Holder, info.PID)
	}
	switch row := idRows[ep.Identity]; {
	case ep.Identity == identity.IdentityUnknown || ep.Identity.IsReserved():
		add(invIdentity, "identity %d is not an allocated one", ep.Identity)
	case row == nil:
		add(invIdentity, "identity %d does not exist", ep.Identity)
	case !row.Labels.Equal(ep.Labels):
		add(invIdentity, "identity %d is %s, the endpoint's labels are %s", ep.Identity, row.Labels, ep.Labels)
	case hasActor && !leases[leaseKey{ep.Identity, info.PID}]:
		add(invIndexActors, "no lease of identity %d held by its actor %s", ep.Identity, info.PID)
	}
	if s.Realized != nil {
		if rev, ok := s.Realized[ep.ID]; !ok || rev != ep.RealizedRevision {
			add(invDatapath, "datapath realised revision %d (present %v), index says %d", rev, ok, ep.RealizedRevision)
		}
	}
	return out
}

// missingFindings: every live pod has its endpoint.
func missingFindings(s *Snapshot, want map[string]expectedPod) []finding {
	have := make(map[string]bool, len(s.Endpoints))
	for _, ep := range s.Endpoints {
		have[ep.ContainerID] = true
	}
	var out []finding
	for cid, w := range want {
		if !have[cid] {
			out = append(out, finding{invEndpointLost, "pod " + cid, cid,
				fmt.Sprintf("%s (address %s) was acknowledged and never deleted, but has no endpoint", cid, w.ip)})
		}
	}
	return out
}

// orphanFinding is the finding of an endpoint's datapath state that
// remains with the endpoint gone.
func orphanFinding(id endpoint.ID) finding {
	return finding{invDatapath, "endpoint " + strconv.Itoa(int(id)), "",
		fmt.Sprintf("datapath state of endpoint %d remains, but the endpoint is gone and was not left to garbage collection", id)}
}

// settledFindings: nothing left in the datapath but live endpoints and
// those handed to garbage collection; the worker pool is idle.
func settledFindings(s *Snapshot, inIndex map[endpoint.ID]bool) []finding {
	var out []finding
	for id := range s.Realized {
		if !inIndex[id] && !s.LeftToGC[id] {
			out = append(out, orphanFinding(id))
		}
	}
	if p := s.Pool; p != nil && (p.Busy > 0 || p.Backlog > 0) {
		out = append(out, finding{invDeleteQueue, "datapath pool", "",
			fmt.Sprintf("datapath worker pool has %d busy workers and %d queued jobs at quiescence", p.Busy, p.Backlog)})
	}
	return out
}
