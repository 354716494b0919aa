package k8s_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
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

// apiIPCache is GET /v1/ipcache's entry for ip ("": none).
func apiIPCache(t *testing.T, k *testAgent, ip string) (uint32, string) {
	t.Helper()
	es, err := k.c.IPCache(k.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.CIDR == ip+"/32" {
			return e.Identity, e.Source
		}
	}
	return 0, ""
}

// TestForgedRemoteEndpointsFromAPIServer: whoever can write
// MembraneEndpoints creates objects that claim another node's pod (as
// node trust-x, whose pod CIDR does not hold it), a reserved identity,
// no node at all (no node label), and this node's own address and
// gateway. The agent's ipcache (GET /v1/ipcache, the index and the
// datapath) keeps the true entries; each refusal is counted by reason;
// trust-x's claims inside its own CIDR are believed; a claim of a node
// not created yet is believed once the Node appears.
func TestForgedRemoteEndpointsFromAPIServer(t *testing.T) {
	const self, selfAddr = "trust-self", "192.0.2.80"
	k := startAgent(t, self, func(c *agent.Config) { c.IPv4Range = netip.MustParsePrefix("10.235.0.0/24") })
	createNode(t, k.cs, "trust-y", []string{"10.235.1.0/24"}, "192.0.2.81")
	createNode(t, k.cs, "trust-x", []string{"10.235.2.0/24"}, "192.0.2.82")
	// This node's own address is the host's (the Linux datapath reports
	// the host netns's addresses; the fake one does not).
	k.a.System.HostAddrChanged(netip.MustParseAddr(selfAddr), false)
	const ns = "trust"
	if _, err := k.cs.CoreV1().Namespaces().Create(k.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = k.dyn.Resource(mepGVR).Namespace(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{})
		_ = k.cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	createMEP(t, k.dyn, ns, "true", "trust-y", "10.235.1.5", 50100, "192.0.2.81")
	isTrue := func() (bool, string) {
		e := remoteRow(k.a, "10.235.1.5")
		id, src := apiIPCache(t, k, "10.235.1.5")
		return e != nil && e.Identity == 50100 && e.TunnelEndpoint == netip.MustParseAddr("192.0.2.81") && id == 50100 && src == index.SourceRemote &&
			k.fake.IPCache()[netip.MustParsePrefix("10.235.1.5/32")] == 50100, fmt.Sprintf("row %+v, api %d %s", e, id, src)
	}
	k.eventually(t, "the true entry", isTrue)
	for _, a := range []string{selfAddr, "10.235.0.1"} {
		k.eventually(t, a+" is host", func() (bool, string) {
			id, src := apiIPCache(t, k, a)
			return id == uint32(identity.ReservedHost) && src == index.SourceReserved, fmt.Sprintf("api %d %s", id, src)
		})
	}

	createMEP(t, k.dyn, ns, "f-cidr", "trust-x", "10.235.1.5", 50666, "192.0.2.82")                            // trust-y's pod
	createMEP(t, k.dyn, ns, "f-reserved", "trust-y", "10.235.1.6", int64(identity.ReservedHost), "192.0.2.81") // reserved
	noLabel := mepObject(ns, "f-nolabel", "trust-y", "10.235.1.7", 50101, "192.0.2.81")
	unstructured.RemoveNestedField(noLabel.Object, "metadata", "labels")
	if _, err := k.dyn.Resource(mepGVR).Namespace(ns).Create(k.ctx, noLabel, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createMEP(t, k.dyn, ns, "f-host", "trust-x", selfAddr, 50102, "192.0.2.82")        // this node's address
	createMEP(t, k.dyn, ns, "f-gateway", "trust-x", "10.235.0.1", 50103, "192.0.2.82") // this node's gateway
	createMEP(t, k.dyn, ns, "f-nodeip", "trust-x", "10.235.2.8", 50104, "192.0.2.81")  // trust-y's address
	createMEP(t, k.dyn, ns, "late", "trust-late", "10.235.3.4", 50105, "192.0.2.83")   // no Node yet
	createMEP(t, k.dyn, ns, "ok-x", "trust-x", "10.235.2.9", 50106, "192.0.2.82")      // its own: believed
	k.eventually(t, "trust-x's own claim", func() (bool, string) {
		e := remoteRow(k.a, "10.235.2.9")
		return e != nil && e.Identity == 50106, fmt.Sprintf("row %+v", e)
	})
	// One watch delivers the objects in order, the sink gets them in
	// rounds in that order: every forged one was handled. Each attack is
	// checked on its own.
	if ok, why := isTrue(); !ok {
		t.Errorf("another node's pod: trust-x's forged claim displaced the true entry: %s", why)
	}
	for _, a := range []string{selfAddr, "10.235.0.1"} {
		id, src := apiIPCache(t, k, a)
		if got := k.fake.IPCache()[netip.MustParsePrefix(a+"/32")]; id != uint32(identity.ReservedHost) || src != index.SourceReserved || got != identity.ReservedHost {
			t.Errorf("this node's address %s after a forged claim: api %d %s, datapath %d; want host", a, id, src, got)
		}
	}
	for a, attack := range map[string]string{"10.235.1.6": "a reserved identity", "10.235.1.7": "no node label",
		"10.235.2.8": "another node's address as node IP", "10.235.3.4": "a node that does not exist"} {
		if e := remoteRow(k.a, a); e != nil {
			t.Errorf("forged claim with %s entered the ipcache: %+v", attack, e)
		}
	}
	// Other tests' objects may be refused too: at least these.
	for reason, n := range map[string]float64{endpoint.RefusedOutsideNode: 3, endpoint.RefusedReserved: 1,
		endpoint.RefusedNodeIP: 1, endpoint.RefusedUnknownNode: 1} {
		if got := refusedClaims(t, k.a, k8s.RemoteSource, reason); got < n {
			t.Errorf("membrane_remote_claims_refused_total{reason=%q} = %v, want at least %v", reason, got, n)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	createNode(t, k.cs, "trust-late", []string{"10.235.3.0/24"}, "192.0.2.83")
	k.eventually(t, "the late node's claim believed", func() (bool, string) {
		e := remoteRow(k.a, "10.235.3.4")
		return e != nil && e.Identity == 50105 && e.TunnelEndpoint == netip.MustParseAddr("192.0.2.83"), fmt.Sprintf("row %+v", e)
	})
	// The forged object goes: the true entry is untouched.
	if err := k.dyn.Resource(mepGVR).Namespace(ns).Delete(k.ctx, "f-cidr", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	createMEP(t, k.dyn, ns, "ok-x2", "trust-x", "10.235.2.10", 50107, "192.0.2.82")
	k.eventually(t, "trust-x's second claim", func() (bool, string) { return remoteRow(k.a, "10.235.2.10") != nil, "absent" })
	k.eventually(t, "the true entry kept", isTrue)
}
