package agent_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/etcdtest"
)

// refusedClaims reads membrane_remote_claims_refused_total{source,reason}.
func refusedClaims(tb testing.TB, a *agent.Agent, source, reason string) float64 {
	tb.Helper()
	mfs, err := a.Metrics().Registry().Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "membrane_remote_claims_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if got["source"] == source && got["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestKvstoreForgedClaims: whoever can write etcd publishes endpoint
// records for a node of its own ("forger", pod CIDR 10.204.66.0/24) that
// claim another node's pod, a reserved identity, another node's name,
// this node's gateway and another node's address as tunnel endpoint.
// Agent B's ipcache keeps the true entries and refuses each forged one
// (counted by reason); the forger's claims inside its own CIDR are
// believed; a record of a node not known yet is believed once the node
// record appears.
func TestKvstoreForgedClaims(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	_, ca := kvAgent(t, srv.Endpoint, "agent-a", 1)
	b, _ := kvAgent(t, srv.Endpoint, "agent-b", 2)
	ctx := ctx10(t)
	ip, err := ca.IPAMAllocate(ctx, "ipv4", "default/pod-a")
	if err != nil {
		t.Fatal(err)
	}
	ep, err := ca.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{ContainerID: "kv-true", K8sNamespace: "default", K8sPodName: "pod-a",
		Labels: []string{"k8s:app=true"}, Addressing: &models.AddressPair{IPv4: ip.Address.IPv4}, SyncBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	podA, idA := netip.MustParseAddr(ip.Address.IPv4), identity.NumericIdentity(ep.Identity.ID)
	isTrue := func(e *index.IPCacheEntry) bool {
		return e != nil && e.Identity == idA && e.Source == index.SourceRemote
	}
	waitIPCache(t, b, podA, isTrue)
	gwB := netip.MustParseAddr("10.204.2.1") // agent-b's gateway: reserved:host on B
	isHost := func(e *index.IPCacheEntry) bool {
		return e != nil && e.Identity == identity.ReservedHost && e.Source == index.SourceReserved
	}
	waitIPCache(t, b, gwB, isHost)

	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	put := func(k, v string) {
		t.Helper()
		if _, err := etcd.Put(ctx, "agent-test/state/"+k, v); err != nil {
			t.Fatal(err)
		}
	}
	put("nodes/v1/forger", `{"name":"forger","addrs":["192.168.90.66"],"podCIDRs":["10.204.66.0/24"]}`)
	rec := func(ip string, id identity.NumericIdentity, node, nodeIP string) string {
		return fmt.Sprintf(`{"ips":[%q],"identity":%d,"node":%q,"nodeIP":%q}`, ip, id, node, nodeIP)
	}
	put("endpoints/v1/forger/1", rec(podA.String(), 60000, "forger", "192.168.90.66"))                 // agent-a's pod
	put("endpoints/v1/forger/2", rec("10.204.66.5", identity.ReservedHost, "forger", "192.168.90.66")) // reserved
	put("endpoints/v1/forger/3", rec("10.204.66.6", 60001, "agent-a", "192.168.90.66"))                // names agent-a
	put("endpoints/v1/forger/4", rec(gwB.String(), 60002, "forger", "192.168.90.66"))                  // B's gateway
	put("endpoints/v1/forger/5", rec("10.204.66.7", 60003, "forger", "192.168.90.1"))                  // agent-a's address
	put("endpoints/v1/late/1", rec("10.204.77.5", 60004, "late", "192.168.90.77"))                     // no node yet
	put("endpoints/v1/forger/6", rec("10.204.66.8", 60005, "forger", "192.168.90.66"))                 // its own: believed
	waitIPCache(t, b, netip.MustParseAddr("10.204.66.8"), func(e *index.IPCacheEntry) bool { return e != nil && e.Identity == 60005 })
	// The watch delivers in revision order: every forged record was
	// handled. Each attack is checked on its own.
	row := func(ip netip.Addr) *index.IPCacheEntry {
		for _, e := range b.Index.IPCache() {
			if e.Prefix == netip.PrefixFrom(ip, 32) {
				return e
			}
		}
		return nil
	}
	if e := row(podA); !isTrue(e) {
		t.Errorf("another node's pod: the forger's claim displaced the true entry: %+v", e)
	}
	if e := row(gwB); !isHost(e) {
		t.Errorf("this node's gateway after a forged claim: %+v; want host", e)
	}
	for a, attack := range map[string]string{"10.204.66.5": "a reserved identity", "10.204.66.6": "another node's name in the record",
		"10.204.66.7": "another node's address as node IP", "10.204.77.5": "a node that does not exist"} {
		if e := row(netip.MustParseAddr(a)); e != nil {
			t.Errorf("forged record with %s entered the ipcache: %+v", attack, e)
		}
	}
	// The node and endpoint watches are two streams: a forger's record
	// may be seen before the forger's node record, refused as of an
	// unknown node first.
	for reason, n := range map[string]float64{endpoint.RefusedOutsideNode: 2, endpoint.RefusedReserved: 1,
		endpoint.RefusedNoOwner: 1, endpoint.RefusedNodeIP: 1, endpoint.RefusedUnknownNode: 1} {
		if got := refusedClaims(t, b, kvstore.Source, reason); got != n && (reason != endpoint.RefusedUnknownNode || got < n) {
			t.Errorf("membrane_remote_claims_refused_total{source=kvstore,reason=%q} = %v, want %v", reason, got, n)
		}
	}
	unknown := refusedClaims(t, b, kvstore.Source, endpoint.RefusedUnknownNode)
	if t.Failed() {
		t.FailNow()
	}
	// The late node appears: its record is believed.
	put("nodes/v1/late", `{"name":"late","addrs":["192.168.90.77"],"podCIDRs":["10.204.77.0/24"]}`)
	waitIPCache(t, b, netip.MustParseAddr("10.204.77.5"), func(e *index.IPCacheEntry) bool {
		return e != nil && e.Identity == 60004 && e.TunnelEndpoint == netip.MustParseAddr("192.168.90.77")
	})
	// The late node's record goes: its endpoint is withdrawn (not a
	// refusal: the count stays).
	if _, err := etcd.Delete(ctx, "agent-test/state/nodes/v1/late"); err != nil {
		t.Fatal(err)
	}
	waitIPCache(t, b, netip.MustParseAddr("10.204.77.5"), func(e *index.IPCacheEntry) bool { return e == nil })
	if got := refusedClaims(t, b, kvstore.Source, endpoint.RefusedUnknownNode); got != unknown {
		t.Errorf("unknown-node refusals %v after the node went, want still %v", got, unknown)
	}
	// The forger's record of agent-a's pod goes: the true entry is untouched.
	if _, err := etcd.Delete(ctx, "agent-test/state/endpoints/v1/forger/1"); err != nil {
		t.Fatal(err)
	}
	put("endpoints/v1/forger/7", rec("10.204.66.9", 60006, "forger", "192.168.90.66"))
	waitIPCache(t, b, netip.MustParseAddr("10.204.66.9"), func(e *index.IPCacheEntry) bool { return e != nil })
	waitIPCache(t, b, podA, isTrue)
}

// TestKvstoreForgedHealthAddrs: whoever writes node records in etcd
// publishes health endpoint addresses: a node's own (inside its pod
// CIDRs) becomes identity health on agent-b; one in another node's
// range and one in agent-b's own range are refused and counted
// (health-outside-node-cidrs); an endpoint record claiming the identity
// health stays refused (reserved-identity).
func TestKvstoreForgedHealthAddrs(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	b, _ := kvAgent(t, srv.Endpoint, "agent-b", 2)
	ctx := ctx10(t)
	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	put := func(k, v string) {
		t.Helper()
		if _, err := etcd.Put(ctx, "agent-test/state/"+k, v); err != nil {
			t.Fatal(err)
		}
	}
	put("nodes/v1/hforger", `{"name":"hforger","addrs":["192.168.90.66"],"podCIDRs":["10.204.66.0/24"],"healthIPs":["10.204.68.9"]}`)  // hgood's range
	put("nodes/v1/hforger2", `{"name":"hforger2","addrs":["192.168.90.67"],"podCIDRs":["10.204.67.0/24"],"healthIPs":["10.204.2.9"]}`) // agent-b's range
	put("nodes/v1/hgood", `{"name":"hgood","addrs":["192.168.90.68"],"podCIDRs":["10.204.68.0/24"],"healthIPs":["10.204.68.2"]}`)
	put("endpoints/v1/hgood/1", `{"ips":["10.204.68.3"],"identity":4,"node":"hgood","nodeIP":"192.168.90.68"}`)
	waitIPCache(t, b, netip.MustParseAddr("10.204.68.2"), func(e *index.IPCacheEntry) bool {
		return e != nil && e.Identity == identity.ReservedHealth && e.Source == index.SourceNode
	})
	testutil.Eventually(t, "two health refusals counted", func() bool {
		return refusedClaims(t, b, kvstore.Source, endpoint.RefusedHealthOutsideNode) == 2 &&
			refusedClaims(t, b, kvstore.Source, endpoint.RefusedReserved) == 1
	})
	for _, a := range []string{"10.204.68.9", "10.204.2.9", "10.204.68.3"} {
		for _, e := range b.Index.IPCache() {
			if e.Prefix == netip.PrefixFrom(netip.MustParseAddr(a), 32) && e.Identity == identity.ReservedHealth {
				t.Errorf("forged health address %s entered the ipcache: %+v", a, e)
			}
		}
	}
}
