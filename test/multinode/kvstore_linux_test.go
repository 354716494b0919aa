package multinode

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestMultiNodeKvstore runs a 3-node cluster per routing mode in kvstore
// mode: a real etcd process on the underlay, every agent with --kvstore
// etcd (nodes, routes, identities and the ipcache from etcd; no nodes
// file). The cases, in order on one cluster:
//   - reach: pods reach each other on one node and across nodes (TCP and
//     ICMP, IPv4 and IPv6) with the nodes learned from etcd, and every
//     node's ipcache (agent and BPF map) is the union of all endpoints;
//   - policy: a CiliumNetworkPolicy app=a -> app=b:8080 imported on every
//     node holds across nodes (same identity everywhere, remote pods in
//     the BPF ipcache) and denies app=c, seen as a policy drop;
//   - identity-race: label sets created at once on all nodes get one
//     number each, the same on every node and in etcd;
//   - etcd-restart: etcd SIGKILLed and restarted on its data directory;
//     traffic keeps working meanwhile, a pod with a known label set is
//     made, one with a new label set waits visibly and completes after,
//     a pod deleted meanwhile goes from etcd and every ipcache after;
//     afterwards nothing is lost;
//   - agent-restart: a node's agent SIGKILLed and restarted at once keeps
//     its entries on the other nodes and its identity references in etcd
//     after its old lease expired (the restart wrote them again);
//   - partition (native only): a node's underlay link down for 30 s
//     (issue 38): its own pods keep reaching each other, its status says
//     etcd is unreachable, the other nodes drop its endpoints and routes
//     once its lease expired; back on the link, it takes a new lease and
//     publishes everything again with the same identities, nothing of
//     its own deleted, and cross-node traffic resumes;
//   - agent-killed: a node's agent SIGKILLed: its pods keep their traffic
//     (pinned programs), and once its lease expired the other nodes drop
//     its endpoints and routes; restarted after the identities only it
//     used were collected, it is back everywhere with agreeing numbers;
//   - node-removed: a node's agent stopped and its lease revoked: its
//     routes and ipcache entries go on the others.
func TestMultiNodeKvstore(t *testing.T) {
	for i, mode := range []string{"native", "tunnel"} {
		t.Run(mode, func(t *testing.T) {
			t.Logf("load average: %s", loadavg())
			c := newKvCluster(t, mode, 3, 85+i)
			a, b, cn := c.nodes[0], c.nodes[1], c.nodes[2]
			waitRoutes(t, a, b, cn)
			pa1, pa2 := a.addPod("a1"), a.addPod("a2")
			pb, pc, pc2 := b.addPod("b1"), cn.addPod("c1"), cn.addPod("c2")
			steps := []struct {
				name string
				fn   func(t *testing.T)
			}{
				{"reach", func(t *testing.T) { kvReach(t, c, pa1, pa2, pb, pc) }},
				{"policy", func(t *testing.T) { kvPolicy(t, c) }},
				{"identity-race", func(t *testing.T) { identityRace(t, c, 10) }},
				{"etcd-restart", func(t *testing.T) { etcdRestart(t, c, pa1, pb, pc) }},
				{"agent-restart", func(t *testing.T) { kvAgentRestart(t, c, b, pa1, pb) }},
				{"partition", func(t *testing.T) {
					if mode != "native" {
						t.Skip("once per run: the native cluster's case (30 s)")
					}
					partition(t, c, cn, pc, pc2, pa1)
				}},
				{"agent-killed", func(t *testing.T) { agentKilled(t, c, cn, pc, pc2, pa1) }},
				{"node-removed", func(t *testing.T) { kvNodeRemoved(t, c, b, pa1, pb) }},
			}
			for _, s := range steps {
				if !t.Run(s.name, s.fn) {
					return // later cases build on the cluster's state
				}
			}
		})
	}
}

// kvReach: same-node and cross-node traffic, the other nodes listed from
// the kvstore, ipcaches converged.
func kvReach(t *testing.T, c *cluster, pa1, pa2, pb, pc *pod) {
	for _, nd := range c.nodes {
		testutil.EventuallyErr(t, nd.name+"'s nodes from the kvstore", func() error { return kvNodesListed(nd, c.nodes) })
	}
	reach(t, pa1, pa2)
	reach(t, pa1, pb)
	reach(t, pb, pc)
	reach(t, pc, pa2)
	waitIPCache(t, c, c.nodes)
	if err := identitiesAgree(c.nodes); err != nil {
		t.Fatal(err)
	}
}

// kvNodesListed: GET /v1/nodes on nd lists every other of want, from the
// kvstore, active.
func kvNodesListed(nd *node, want []*node) error {
	ns, err := nd.api.Nodes(context.Background())
	if err != nil {
		return err
	}
	for _, o := range want {
		if o == nd {
			continue
		}
		if !slices.ContainsFunc(ns, func(n models.Node) bool { return n.Name == o.name && n.Source == "kvstore" && n.Active }) {
			return fmt.Errorf("%s not listed active from the kvstore: %s", o.name, jsonString(ns))
		}
	}
	return nil
}

// ipEntry is what an ipcache should map one address to.
type ipEntry struct {
	id     uint32
	tunnel netip.Addr // tunnel mode, remote: the hosting node
}

// expectedIPCache is the union of live's endpoints (with an identity), as
// node nd's ipcache should hold it.
func expectedIPCache(c *cluster, nd *node, live []*node) (map[netip.Prefix]ipEntry, error) {
	want := map[netip.Prefix]ipEntry{}
	for _, o := range live {
		eps, err := o.api.EndpointList(context.Background(), nil)
		if err != nil {
			return nil, fmt.Errorf("%s: list endpoints: %w", o.name, err)
		}
		for _, ep := range eps {
			if ep.Identity == nil || ep.Addressing == nil {
				continue
			}
			e := ipEntry{id: uint32(ep.Identity.ID)}
			if o != nd { // the publishing node's address (its IPv4 one when it has both)
				e.tunnel = o.addr4
			}
			for _, s := range []string{ep.Addressing.IPv4, ep.Addressing.IPv6} {
				if a, err := netip.ParseAddr(s); err == nil {
					want[netip.PrefixFrom(a, a.BitLen())] = e
				}
			}
		}
	}
	return want, nil
}

// inPodRanges reports whether p is a pod address of any node of c.
func (c *cluster) inPodRanges(p netip.Prefix) bool {
	for _, o := range c.nodes {
		if (o.cidr4.Contains(p.Addr()) || o.cidr6.Contains(p.Addr())) && p.IsSingleIP() {
			return true
		}
	}
	return false
}

// checkIPCache compares nd's ipcaches (the BPF map pinned by its agent,
// and GET /v1/ipcache) with the union of live's endpoints: exactly those
// pod addresses, with their identities (and tunnel endpoints).
func checkIPCache(c *cluster, nd *node, live []*node) error {
	want, err := expectedIPCache(c, nd, live)
	if err != nil {
		return err
	}
	held, err := datapath.ReadPinnedIPCache(nd.bpffs)
	if err != nil {
		return err
	}
	got := map[netip.Prefix]ipEntry{}
	for p, v := range held {
		if c.inPodRanges(p) && !nd.ownGateway(p, uint32(v.Identity)) {
			got[p] = ipEntry{id: uint32(v.Identity), tunnel: v.TunnelEndpoint}
		}
	}
	if d := diffIPCache(want, got); d != "" {
		return fmt.Errorf("%s's BPF ipcache: %s", nd.name, d)
	}
	rows, err := nd.api.IPCache(context.Background())
	if err != nil {
		return err
	}
	clear(got)
	for _, r := range rows {
		p, err := netip.ParsePrefix(r.CIDR)
		if err != nil {
			return fmt.Errorf("%s: GET /v1/ipcache row %q: %w", nd.name, r.CIDR, err)
		}
		if c.inPodRanges(p) && !nd.ownGateway(p, r.Identity) {
			got[p] = ipEntry{id: r.Identity, tunnel: want[p].tunnel} // the API does not show tunnel endpoints
		}
	}
	if d := diffIPCache(want, got); d != "" {
		return fmt.Errorf("%s's GET /v1/ipcache: %s", nd.name, d)
	}
	return nil
}

// ownGateway reports nd's own gateway address in its pod range (the
// host identity, 1), which is no endpoint.
func (nd *node) ownGateway(p netip.Prefix, id uint32) bool {
	return id == 1 && (nd.cidr4.Contains(p.Addr()) || nd.cidr6.Contains(p.Addr()))
}

func diffIPCache(want, got map[netip.Prefix]ipEntry) string {
	var d []string
	for p, w := range want {
		if g, ok := got[p]; !ok {
			d = append(d, fmt.Sprintf("missing %s (identity %d)", p, w.id))
		} else if g != w {
			d = append(d, fmt.Sprintf("%s is %d via %v, want %d via %v", p, g.id, g.tunnel, w.id, w.tunnel))
		}
	}
	for p, g := range got {
		if _, ok := want[p]; !ok {
			d = append(d, fmt.Sprintf("stale %s (identity %d)", p, g.id))
		}
	}
	slices.Sort(d)
	return strings.Join(d, "; ")
}

// waitIPCache waits until every live node's ipcaches hold exactly the
// union of live's endpoints.
func waitIPCache(t *testing.T, c *cluster, live []*node) {
	t.Helper()
	for _, nd := range live {
		testutil.EventuallyErr(t, nd.name+"'s ipcache = every live node's endpoints", func() error { return checkIPCache(c, nd, live) })
	}
}

// identitiesAgree: every label set has one number on all nodes (GET
// /v1/identity on each) and no number stands for two label sets.
func identitiesAgree(nodes []*node) error {
	byLabels := map[string]int64{}
	byID := map[int64]string{}
	seen := map[string]string{} // labels -> node that reported it first
	for _, nd := range nodes {
		ids, err := nd.api.Identities(context.Background())
		if err != nil {
			return fmt.Errorf("%s: GET /v1/identity: %w", nd.name, err)
		}
		for _, id := range ids {
			if id.Reserved {
				continue
			}
			key := labelsKey(id.Labels)
			if n, ok := byLabels[key]; ok && n != id.ID {
				return fmt.Errorf("labels %s: identity %d on %s, %d on %s", key, n, seen[key], id.ID, nd.name)
			}
			if k, ok := byID[id.ID]; ok && k != key {
				return fmt.Errorf("identity %d: labels %s and %s (%s)", id.ID, k, key, nd.name)
			}
			byLabels[key], byID[id.ID] = id.ID, key
			if _, ok := seen[key]; !ok {
				seen[key] = nd.name
			}
		}
	}
	return nil
}

func labelsKey(ls []string) string {
	s := slices.Clone(ls)
	slices.Sort(s)
	return strings.Join(s, ",")
}

// endpointOf returns p's endpoint on its node.
func endpointOf(t *testing.T, p *pod) *models.Endpoint {
	t.Helper()
	ep, err := p.node.api.EndpointGet(context.Background(), "container-id:"+p.rt.ContainerID)
	if err != nil {
		t.Fatalf("%s: endpoint of %s: %v", p.node.name, p.name, err)
	}
	return ep
}

// labelPod adds labels to p's endpoint and waits until it has an identity
// with them.
func labelPod(t *testing.T, p *pod, add ...string) *models.Endpoint {
	t.Helper()
	ep, err := p.node.api.EndpointPatchLabels(context.Background(), "container-id:"+p.rt.ContainerID, add, nil)
	if err != nil {
		t.Fatalf("%s: label %s %v: %v", p.node.name, p.name, add, err)
	}
	testutil.EventuallyErr(t, p.name+"'s identity with "+strings.Join(add, ","), func() error {
		ep = endpointOf(t, p)
		if ep.Identity == nil || !slices.Contains(ep.Identity.Labels, add[0]) {
			return fmt.Errorf("identity %+v", ep.Identity)
		}
		return nil
	})
	return ep
}

// kvPolicyDoc allows app=a to app=b on TCP 8080 (CiliumNetworkPolicy).
const kvPolicyDoc = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: kv-a-to-b
  namespace: default
spec:
  endpointSelector:
    matchLabels:
      app: b
  ingress:
  - fromEndpoints:
    - matchLabels:
        app: a
    toPorts:
    - ports:
      - port: "8080"
        protocol: TCP
`

// kvPolicy: pods app=a, app=b, app=c on three nodes; the policy imported
// on every node lets a reach b on 8080 and not c, across nodes.
func kvPolicy(t *testing.T, c *cluster) {
	a, b, cn := c.nodes[0], c.nodes[1], c.nodes[2]
	pa, pb, pc := a.addPod("pol-a"), b.addPod("pol-b"), cn.addPod("pol-c")
	ida, idb, idc := labelPod(t, pa, "k8s:app=a"), labelPod(t, pb, "k8s:app=b"), labelPod(t, pc, "k8s:app=c")
	var rev uint64
	for _, nd := range c.nodes {
		res, err := nd.api.PolicyImport(context.Background(), []byte(kvPolicyDoc), "")
		if err != nil {
			t.Fatalf("%s: PUT /v1/policy: %v", nd.name, err)
		}
		if nd == b {
			rev = res.Revision
		}
		t.Cleanup(func() {
			if nd.proc.Running() {
				_, _ = nd.api.PolicyDelete(context.Background(), "kv-a-to-b")
			}
		})
	}
	// Same identity on every node: b knows a's and c's numbers from etcd,
	// and its BPF ipcache maps their addresses to them.
	waitIPCache(t, c, c.nodes)
	if err := identitiesAgree(c.nodes); err != nil {
		t.Fatal(err)
	}
	held, err := datapath.ReadPinnedIPCache(b.bpffs)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		p  *pod
		id int64
	}{{pa, ida.Identity.ID}, {pc, idc.Identity.ID}} {
		for _, ip := range []netip.Addr{x.p.ip4, x.p.ip6} {
			if v := held[netip.PrefixFrom(ip, ip.BitLen())]; int64(v.Identity) != x.id {
				t.Fatalf("%s's BPF ipcache maps %s (%s) to %d, want %d", b.name, ip, x.p.name, v.Identity, x.id)
			}
		}
	}
	testutil.EventuallyErr(t, "pol-b's BPF policy map allows app=a on 8080", func() error {
		return realised(pb, rev, uint32(ida.Identity.ID))
	})
	for _, ip := range []netip.Addr{pb.ip4, pb.ip6} {
		testutil.EchoServer(t, pb.ns, ip, 8080)
		if err := testutil.Exchange(pa.ns, ip, 8080, 10*time.Second); err != nil {
			t.Fatalf("app=a -> app=b %s:8080 across nodes: %v", ip, err)
		}
		if err := testutil.Exchange(pc.ns, ip, 8080, 2*time.Second); err == nil {
			t.Fatalf("app=c -> app=b %s:8080 across nodes was allowed", ip)
		}
	}
	testutil.EventuallyErr(t, "a policy drop on "+b.name+" for pol-b", func() error {
		ds, err := b.api.Drops(context.Background())
		if err != nil {
			return err
		}
		for _, d := range ds {
			if d.Endpoint == idb.ID && d.Reason == datapath.DropPolicy && d.Direction == "ingress" && d.Packets > 0 {
				return nil
			}
		}
		return fmt.Errorf("drops %s", jsonString(ds))
	})
}

// realised: p's endpoint computed the policy of repository revision rev
// (or later), enforces ingress, and its BPF policy map holds exactly the
// computed entries, among them ingress TCP 8080 from identity from.
func realised(p *pod, rev uint64, from uint32) error {
	pol, err := p.node.api.EndpointPolicy(context.Background(), "container-id:"+p.rt.ContainerID)
	switch {
	case err != nil:
		return err
	case pol.PolicyRevision < rev:
		return fmt.Errorf("computed revision %d < %d", pol.PolicyRevision, rev)
	case pol.RealizedError != "":
		return fmt.Errorf("realised: %s", pol.RealizedError)
	case !pol.IngressEnforced || !pol.RealizedIngressEnforced:
		return fmt.Errorf("ingress enforcement: computed %v, realised %v", pol.IngressEnforced, pol.RealizedIngressEnforced)
	case len(pol.Computed) != len(pol.Realized):
		return fmt.Errorf("%d entries computed, %d realised", len(pol.Computed), len(pol.Realized))
	}
	found := false
	for i, e := range pol.Computed {
		if pol.Realized[i].PolicyEntry != e {
			return fmt.Errorf("entry %d computed %+v, realised %+v", i, e, pol.Realized[i].PolicyEntry)
		}
		found = found || (e.Identity == from && e.Port == 8080 && strings.EqualFold(e.Protocol, "tcp") && e.Direction == "ingress")
	}
	if !found {
		return fmt.Errorf("no ingress TCP 8080 entry for identity %d in %s", from, jsonString(pol.Computed))
	}
	return nil
}

// identityRace makes sets label sets at once on every node (one pod per
// label set and node, all ADDs concurrent) and checks that each label set
// got one number, the same on every node and in etcd.
func identityRace(t *testing.T, c *cluster, sets int) {
	type made struct {
		p   *pod
		set int
	}
	var mu sync.Mutex
	var pods []made
	var wg sync.WaitGroup
	errs := make(chan error, sets*len(c.nodes))
	for _, nd := range c.nodes {
		for i := range sets {
			p := nd.newPod(fmt.Sprintf("race-%d", i), fmt.Sprintf("race-%d-%d", c.net, i))
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := nd.runAdd(p); err != nil {
					errs <- fmt.Errorf("%s: ADD %s: %w", nd.name, p.name, err)
					return
				}
				mu.Lock()
				pods = append(pods, made{p, i})
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	ids := map[int]map[int64]string{} // set -> number -> nodes
	for _, m := range pods {
		ep := endpointOf(t, m.p)
		if ep.Identity == nil {
			t.Fatalf("%s: %s has no identity", m.p.node.name, m.p.name)
		}
		if ids[m.set] == nil {
			ids[m.set] = map[int64]string{}
		}
		ids[m.set][ep.Identity.ID] += m.p.node.name + " "
	}
	for set, byID := range ids {
		if len(byID) != 1 {
			t.Errorf("label set race-%d has several numbers: %v", set, byID)
		}
	}
	if err := identitiesAgree(c.nodes); err != nil {
		t.Fatal(err)
	}
	// etcd: each label set under one number, both directions.
	idKeys, err := c.etcd.keys("state/identities/v1/id/")
	if err != nil {
		t.Fatal(err)
	}
	lblKeys, err := c.etcd.keys("state/identities/v1/labels/")
	if err != nil {
		t.Fatal(err)
	}
	for n, lk := range idKeys {
		if lblKeys[lk] != n {
			t.Errorf("etcd: id/%s has labels %s, whose labels key holds %q", n, lk, lblKeys[lk])
		}
	}
	if len(idKeys) != len(lblKeys) {
		t.Errorf("etcd: %d id keys, %d labels keys", len(idKeys), len(lblKeys))
	}
	t.Logf("%d pods on %d nodes, %d label sets raced; etcd holds %d identities", len(pods), len(c.nodes), sets, len(idKeys))
	// The race pods go now, so the later cases start from the first pods.
	for _, m := range pods {
		if err := m.p.node.runDel(m.p); err != nil {
			t.Errorf("%s: DEL %s: %v", m.p.node.name, m.p.name, err)
		}
	}
	waitIPCache(t, c, c.nodes)
}

// etcdRestart kills etcd mid-run and starts it again on its data.
func etcdRestart(t *testing.T, c *cluster, pa, pb, pc *pod) {
	a, b := c.nodes[0], c.nodes[1]
	// A connection open across the outage.
	conn := dial(t, pa, pb, int(nextPort.Add(1)), func(c net.Conn) { _, _ = io.Copy(c, c) })
	roundTrip(t, conn, "before the outage")
	// A pod deleted during the outage: its key goes once etcd is back.
	gone := c.nodes[2].addPod("outage-gone")
	waitIPCache(t, c, c.nodes)
	leases := nodeLeases(t, c.nodes)
	c.etcd.kill()
	waitKvstoreUnhealthy(t, c.nodes)
	// Existing pods keep reaching each other, on the open connection too.
	roundTrip(t, conn, "during the outage")
	reach(t, pa, pb)
	reach(t, pb, pc)
	if err := gone.node.runDel(gone); err != nil {
		t.Fatalf("DEL during the outage: %v", err)
	}
	// A pod whose label set is in use on its node: made at once, reaches
	// pods on its node and on others (which route its node's pod range;
	// its address reaches their ipcaches once etcd is back).
	known := a.addPod("outage-known")
	reach(t, known, pa)
	reach(t, known, pb)
	// A pod with a new label set waits until etcd returns.
	w := startWaitingAdd(t, b, fmt.Sprintf("outage-new-%d", c.net))
	if err := c.etcd.start(); err != nil {
		t.Fatal(err)
	}
	ready := time.Now() // etcd answers again
	if err := <-w.done; err != nil {
		t.Fatalf("ADD of a new label set after etcd returned: %v", err)
	}
	t.Logf("etcd back: the waiting ADD completed %v later (ADD attempt %d, begun %v after etcd was back)",
		time.Since(ready).Round(time.Millisecond), w.attempts, w.lastStart.Sub(ready).Round(time.Millisecond))
	waitIPCache(t, c, c.nodes)
	t.Logf("etcd back: every ipcache the union of all endpoints %v later", time.Since(ready).Round(time.Millisecond))
	// The leases of before the outage: each is still the node's, or gone
	// (a node that lost it wrote everything again under a new one); only
	// then is what etcd holds final.
	for _, nd := range c.nodes {
		testutil.EventuallyErr(t, nd.name+"'s lease of before the outage kept or expired", func() error { return leaseSettled(c, nd, leases[nd]) })
	}
	waitIPCache(t, c, c.nodes)
	if err := identitiesAgree(c.nodes); err != nil {
		t.Fatal(err)
	}
	reach(t, w.p, pa)
	reach(t, known, pc)
	roundTrip(t, conn, "after the outage")
	nothingLost(t, c)
}

// nodeLeases returns each node's current lease.
func nodeLeases(t *testing.T, nodes []*node) map[*node]int64 {
	t.Helper()
	leases := map[*node]int64{}
	for _, nd := range nodes {
		st, err := nd.api.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		leases[nd] = st.Kvstore.Lease
	}
	return leases
}

// waitKvstoreUnhealthy waits until every node's /v1/status says etcd is
// unreachable.
func waitKvstoreUnhealthy(t *testing.T, nodes []*node) {
	t.Helper()
	for _, nd := range nodes {
		testutil.EventuallyErr(t, nd.name+" reports etcd unhealthy", func() error {
			st, err := nd.api.Status(context.Background())
			if err != nil {
				return err
			}
			if st.Kvstore == nil || st.Kvstore.Healthy {
				return fmt.Errorf("kvstore status %s", jsonString(st.Kvstore))
			}
			return nil
		})
	}
}

// waitingAdd is a pod's ADD retried in the background (as kubelet would)
// while its new label set waits for the identity store.
type waitingAdd struct {
	p    *pod
	done chan error
	// attempts and lastStart are read after done answered.
	attempts  int
	lastStart time.Time
}

// startWaitingAdd starts ADDs of a pod in Kubernetes namespace namespace
// (a label set new to the cluster) on nd while etcd is away, and checks
// that it waits visibly: the plugin's ADD fails with the identity store's
// unavailability, /v1/status lists the label set as waiting, and no ADD
// succeeds.
func startWaitingAdd(t *testing.T, nd *node, namespace string) *waitingAdd {
	t.Helper()
	w := &waitingAdd{p: nd.newPod("outage-new", namespace), done: make(chan error, 1)}
	first := make(chan error, 1)
	go func() { w.done <- addRetrying(nd, w.p, first, &w.attempts, &w.lastStart) }()
	select {
	case err := <-first:
		if !strings.Contains(err.Error(), "identity-store-unavailable") && !strings.Contains(err.Error(), "cluster identity store unavailable") {
			t.Errorf("ADD during the outage failed with %v, want the identity store's unavailability", err)
		}
	case err := <-w.done:
		t.Fatalf("ADD of a new label set completed without etcd: %v", err)
	}
	testutil.EventuallyErr(t, nd.name+" shows the label set waiting", func() error {
		st, err := nd.api.Status(context.Background())
		if err != nil {
			return err
		}
		if ci := st.ClusterIdentity; ci == nil || ci.Waiting == 0 || !strings.Contains(strings.Join(ci.WaitingLabels, " "), namespace) {
			return fmt.Errorf("cluster identity status %s", jsonString(st.ClusterIdentity))
		}
		return nil
	})
	select {
	case err := <-w.done:
		t.Fatalf("ADD of a new label set completed without etcd: %v", err)
	default:
	}
	return w
}

// nothingLost: etcd holds every node, exactly each node's endpoints and
// each node's reference to every identity it uses.
func nothingLost(t *testing.T, c *cluster) {
	t.Helper()
	nodes, err := c.etcd.keys("state/nodes/v1/")
	if err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.nodes {
		if _, ok := nodes[nd.name]; !ok {
			t.Errorf("etcd lost node %s (has %v)", nd.name, nodes)
		}
		testutil.EventuallyErr(t, nd.name+"'s endpoints in etcd", func() error { return publishedAll(c, nd) })
		if err := refsCover(c, nd); err != nil {
			t.Error(err)
		}
	}
}

// roundTrip sends a few bytes on conn (an echo) and reads them back.
func roundTrip(t *testing.T, conn net.Conn, when string) {
	t.Helper()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	msg := []byte("kvstore " + when)
	if _, err := conn.Write(msg); err != nil {
		t.Fatalf("open connection %s: write: %v", when, err)
	}
	if _, err := io.ReadFull(conn, make([]byte, len(msg))); err != nil {
		t.Fatalf("open connection %s: read: %v", when, err)
	}
}

// leaseSettled: nd's lease old is still its lease, or etcd holds it no
// more.
func leaseSettled(c *cluster, nd *node, old int64) error {
	st, err := nd.api.Status(context.Background())
	if err != nil {
		return err
	}
	if st.Kvstore.Lease == old {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := c.etcd.cli.TimeToLive(ctx, leaseID(old))
	if err != nil {
		return err
	}
	if r.TTL != -1 {
		return fmt.Errorf("lease %x (now %x) has %d s left", old, st.Kvstore.Lease, r.TTL)
	}
	return nil
}

// addRetrying runs ADD for p until it succeeds (DEL after each failure,
// as kubelet does), bounded at 2 minutes; the first failure goes to
// first; attempts and last record the attempts and when the last began
// (read after the result).
func addRetrying(nd *node, p *pod, first chan<- error, attempts *int, last *time.Time) error {
	deadline := time.Now().Add(2 * time.Minute)
	for n := 0; ; n++ {
		*attempts, *last = n+1, time.Now()
		err := nd.runAdd(p)
		if err == nil {
			return nil
		}
		if n == 0 {
			first <- err
		}
		_ = nd.runDel(p)
		if time.Now().After(deadline) {
			return fmt.Errorf("after %d attempts: %w", n+1, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// publishedAll: etcd holds exactly nd's endpoints with an identity.
func publishedAll(c *cluster, nd *node) error {
	keys, err := c.etcd.keys("state/endpoints/v1/" + nd.name + "/")
	if err != nil {
		return err
	}
	eps, err := nd.api.EndpointList(context.Background(), nil)
	if err != nil {
		return err
	}
	n := 0
	for _, ep := range eps {
		if ep.Identity == nil {
			continue
		}
		n++
		if _, ok := keys[fmt.Sprint(ep.ID)]; !ok {
			return fmt.Errorf("endpoint %d not in etcd (keys %v)", ep.ID, keys)
		}
	}
	if len(keys) != n {
		return fmt.Errorf("etcd holds %d endpoints of %s, it has %d", len(keys), nd.name, n)
	}
	return nil
}

// kvAgentRestart SIGKILLs nd's agent and starts it again before its
// lease expires. Once the old lease is gone from etcd, the other nodes
// still route to nd and hold its endpoints, etcd still holds its node,
// endpoints and identity references (all written again under the new
// lease), and its pods reach across nodes.
func kvAgentRestart(t *testing.T, c *cluster, nd *node, remote, local *pod) {
	st, err := nd.api.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	old := st.Kvstore.Lease
	nd.kill()
	if err := nd.start(); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyErr(t, nd.name+"'s old lease expired", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := c.etcd.cli.TimeToLive(ctx, leaseID(old))
		if err != nil {
			return err
		}
		if r.TTL != -1 {
			return fmt.Errorf("lease %x has %d s left", old, r.TTL)
		}
		return nil
	})
	waitRoutes(t, c.nodes...)
	waitIPCache(t, c, c.nodes)
	for _, o := range c.nodes {
		if err := publishedAll(c, o); err != nil {
			t.Fatal(err)
		}
		if err := refsCover(c, o); err != nil {
			t.Fatal(err)
		}
	}
	reach(t, local, remote)
}

// refsCover: etcd holds nd's reference to every identity its endpoints
// use (refs/<hash of the labels>/<node>; without it the identity GC may
// collect a number in use).
func refsCover(c *cluster, nd *node) error {
	refs, err := c.etcd.keys("state/identities/v1/refs/")
	if err != nil {
		return err
	}
	labelsOf, err := c.etcd.keys("state/identities/v1/id/")
	if err != nil {
		return err
	}
	eps, err := nd.api.EndpointList(context.Background(), nil)
	if err != nil {
		return err
	}
	for _, ep := range eps {
		if ep.Identity == nil || ep.Identity.Reserved {
			continue
		}
		lk, ok := labelsOf[fmt.Sprint(ep.Identity.ID)]
		if !ok {
			return fmt.Errorf("etcd lost identity %d of %s's endpoint %d", ep.Identity.ID, nd.name, ep.ID)
		}
		sum := sha256.Sum256([]byte(lk))
		if _, ok := refs[hex.EncodeToString(sum[:16])+"/"+nd.name]; !ok {
			return fmt.Errorf("etcd holds no reference of %s to identity %d (%s) its endpoint %d uses", nd.name, ep.Identity.ID, lk, ep.ID)
		}
	}
	return nil
}

// agentKilled SIGKILLs nd's agent. While its lease lives its pods keep
// their traffic, same node and across nodes (the programs and maps are
// pinned); the test holds the dead agent's lease meanwhile, so that check
// does not race the TTL. Released, the lease expires and the other nodes
// drop nd's endpoints from their ipcaches and its routes; nd's own pods
// still reach each other. The identities only nd used are then removed
// from etcd (as the GC would after its grace) and nd restarted: it is
// routed to and mirrored again, and its identities are back in etcd,
// numbered as on every node and as before.
func agentKilled(t *testing.T, c *cluster, nd *node, p1, p2, remote *pod) {
	st, err := nd.api.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	lease := st.Kvstore.Lease
	numbers := endpointNumbers(t, nd)
	nd.kill()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := c.etcd.cli.KeepAlive(ctx, leaseID(lease)); err != nil {
		t.Fatalf("hold %s's lease: %v", nd.name, err)
	}
	reach(t, p1, p2)
	reach(t, p1, remote)
	cancel()
	released := time.Now()
	var live []*node
	for _, o := range c.nodes {
		if o != nd {
			live = append(live, o)
		}
	}
	waitIPCache(t, c, live)
	for _, o := range live {
		testutil.EventuallyErr(t, o.name+" drops "+nd.name+"'s routes", func() error { return noRoutesTo(o, nd) })
	}
	t.Logf("lease released: %s's entries gone from every ipcache and route table %v later (TTL %v)", nd.name,
		time.Since(released).Round(time.Millisecond), leaseTTL)
	reach(t, p1, p2)
	// Down longer than the identity GC's grace: the identities no live
	// node references go (the test removes them as the GC would; the
	// agents' GC runs every minute with a 5 minute grace).
	collected := collectUnreferenced(t, c)
	t.Logf("identities no node references, removed while %s is down: %d", nd.name, len(collected))
	// Restarted on its state, the agent publishes its node and endpoints
	// under a new lease: the others route to it and hold them again, and
	// the identities its endpoints use are in etcd again with its
	// references, numbered as on every node.
	if err := nd.start(); err != nil {
		t.Fatal(err)
	}
	waitRoutes(t, c.nodes...)
	waitIPCache(t, c, c.nodes)
	if err := identitiesAgree(c.nodes); err != nil {
		t.Fatal(err)
	}
	for _, o := range c.nodes {
		testutil.EventuallyErr(t, o.name+"'s identity references in etcd", func() error { return refsCover(c, o) })
	}
	// Every endpoint keeps its number: one whose identity the GC took
	// meanwhile gets it back (the agent asks the store for the number its
	// endpoints hold, and no node numbered those labels anew meanwhile).
	after := endpointNumbers(t, nd)
	back := 0
	for ep, n := range numbers {
		if after[ep] != n {
			t.Fatalf("%s's endpoint %d: identity %d after the restart, %d before", nd.name, ep, after[ep], n)
		}
		if _, gone := collected[fmt.Sprint(n)]; gone {
			back++
		}
	}
	t.Logf("%s restarted: %d of its %d endpoints had their collected identity re-created with its number", nd.name, back, len(numbers))
	reach(t, p1, remote)
}

// partitionFor is how long partition keeps the node's link down: six
// lease TTLs, as the 30 s.
const partitionFor = 30 * time.Second

// partition takes nd's underlay link down for partitionFor (a pulled
// cable: the addresses stay), local1 and local2 being nd's pods and
// remote another node's.
func partition(t *testing.T, c *cluster, nd *node, local1, local2, remote *pod) {
	st, err := nd.api.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	lease, regrants := st.Kvstore.Lease, st.Kvstore.LeaseRegrants
	numbers := endpointNumbers(t, nd)
	eth0, err := nd.nl.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nd.ns.Exec("sysctl", "-qw", "net.ipv6.conf.eth0.keep_addr_on_down=1"); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	if err := nd.nl.LinkSetDown(eth0); err != nil {
		t.Fatal(err)
	}
	up := func() {
		if err := nd.nl.LinkSetUp(eth0); err != nil {
			t.Errorf("link up: %v", err)
		}
	}
	defer func() {
		if t.Failed() { // leave the cluster whole for the report, not cut
			up()
		}
	}()
	var live []*node
	for _, o := range c.nodes {
		if o != nd {
			live = append(live, o)
		}
	}
	testutil.EventuallyErr(t, nd.name+" reports etcd unreachable", func() error {
		st, err := nd.api.Status(context.Background())
		if err != nil {
			return err
		}
		if st.Kvstore.Healthy {
			return fmt.Errorf("kvstore %+v", st.Kvstore)
		}
		return nil
	})
	reach(t, local1, local2) // the node's own pods are not cut
	waitIPCache(t, c, live)
	for _, o := range live {
		testutil.EventuallyErr(t, o.name+" drops "+nd.name+"'s routes", func() error { return noRoutesTo(o, nd) })
	}
	t.Logf("%s cut: its lease expired and its entries left the other nodes %v after the link went down (TTL %v)",
		nd.name, time.Since(down).Round(time.Millisecond), leaseTTL)
	time.Sleep(time.Until(down.Add(partitionFor)))
	if got := endpointNumbers(t, nd); !maps.Equal(got, numbers) {
		t.Fatalf("%s's endpoints changed while cut off: %v, before %v", nd.name, got, numbers)
	}
	up()
	back := time.Now()
	testutil.EventuallyErr(t, nd.name+" back on etcd with a new lease", func() error {
		st, err := nd.api.Status(context.Background())
		if err != nil {
			return err
		}
		if k := st.Kvstore; !k.Healthy || k.Lease == lease || k.Lease == 0 || k.LeaseRegrants <= regrants {
			return fmt.Errorf("kvstore %+v (lease before %x)", k, lease)
		}
		return nil
	})
	waitRoutes(t, c.nodes...)
	waitIPCache(t, c, c.nodes)
	if err := identitiesAgree(c.nodes); err != nil {
		t.Fatal(err)
	}
	if got := endpointNumbers(t, nd); !maps.Equal(got, numbers) {
		t.Fatalf("%s's endpoints after the partition: %v, before %v", nd.name, got, numbers)
	}
	reach(t, remote, local1)
	t.Logf("%s back: routes, ipcaches and traffic converged %v after the link came up", nd.name, time.Since(back).Round(time.Millisecond))
}

// endpointNumbers maps nd's endpoints to their identities.
func endpointNumbers(t *testing.T, nd *node) map[int64]int64 {
	t.Helper()
	eps, err := nd.api.EndpointList(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]int64{}
	for _, ep := range eps {
		if ep.Identity != nil {
			out[ep.ID] = ep.Identity.ID
		}
	}
	return out
}

// collectUnreferenced deletes from etcd every identity (id/ and labels/
// keys) no node holds a reference to, as the identity GC does once its
// grace ran out; it returns them (number -> labels).
func collectUnreferenced(t *testing.T, c *cluster) map[string]string {
	t.Helper()
	refs, err := c.etcd.keys("state/identities/v1/refs/")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := c.etcd.keys("state/identities/v1/id/")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for n, lk := range ids {
		sum := sha256.Sum256([]byte(lk))
		h := hex.EncodeToString(sum[:16]) + "/"
		used := false
		for k := range refs {
			if strings.HasPrefix(k, h) {
				used = true
			}
		}
		if used {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.etcd.cli.Delete(ctx, "membrane/state/identities/v1/id/"+n)
		if err == nil {
			_, err = c.etcd.cli.Delete(ctx, "membrane/state/identities/v1/labels/"+lk)
		}
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		out[n] = lk
	}
	return out
}

// kvNodeRemoved stops nd's agent cleanly and revokes its lease, as an
// operator removing the node would: the others lose its routes, its
// ipcache entries and its row in GET /v1/nodes.
func kvNodeRemoved(t *testing.T, c *cluster, nd *node, from, to *pod) {
	var live []*node
	for _, o := range c.nodes {
		if o != nd && o.proc.Running() {
			live = append(live, o)
		}
	}
	// Before: the others route to nd and hold its endpoints.
	waitRoutes(t, append(slices.Clone(live), nd)...)
	waitIPCache(t, c, append(slices.Clone(live), nd))
	st, err := nd.api.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	nd.stop()
	if err := c.etcd.revoke(st.Kvstore.Lease); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	waitIPCache(t, c, live)
	for _, o := range live {
		testutil.EventuallyErr(t, o.name+" drops "+nd.name+"'s routes", func() error { return noRoutesTo(o, nd) })
		ns, err := o.api.Nodes(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(jsonString(ns), nd.name) {
			t.Fatalf("%s: GET /v1/nodes still lists %s: %s", o.name, nd.name, jsonString(ns))
		}
	}
	t.Logf("lease revoked: %s's entries gone from every ipcache and route table %v later", nd.name, time.Since(revoked).Round(time.Millisecond))
	port := int(nextPort.Add(1))
	testutil.EchoServer(t, to.ns, to.ip4, port)
	if err := testutil.Exchange(from.ns, to.ip4, port, 2*time.Second); err == nil {
		t.Fatalf("TCP to %s on removed node %s still works", to.ip4, nd.name)
	}
}

// noRoutesTo: o routes none of gone's pod CIDRs.
func noRoutesTo(o, gone *node) error {
	rs, err := o.nodeRoutes()
	if err != nil {
		return err
	}
	for _, p := range []netip.Prefix{gone.cidr4, gone.cidr6} {
		if via, ok := rs[p]; ok {
			return fmt.Errorf("route to %s still %s", p, via)
		}
	}
	return nil
}
