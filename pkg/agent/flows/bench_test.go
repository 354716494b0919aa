package flows

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// BenchmarkStoreOnFlow is the agent's CPU per flow report (BENCHMARKS.md):
// the enrichment from the index, and with an enforced direction the
// policies re-evaluated (100 policies), on the ring reader's goroutine.
func BenchmarkStoreOnFlow(b *testing.B) {
	ix, err := index.New()
	if err != nil {
		b.Fatal(err)
	}
	txn := ix.WriteTxn()
	for i, app := range []string{"a", "b"} {
		ls, err := labels.New(mustLabel(b, "k8s:app="+app), mustLabel(b, "k8s:io.kubernetes.pod.namespace=default"))
		if err != nil {
			b.Fatal(err)
		}
		id := identity.NumericIdentity(1001 + i)
		addr := netip.AddrFrom4([4]byte{10, 0, 0, byte(3 + i)})
		ep := &endpoint.Endpoint{ID: endpoint.ID(3 + i), Namespace: "default", PodName: app, Labels: ls, Identity: id, IPv4: addr,
			State: endpoint.StateReady}
		for _, r := range []struct {
			table string
			obj   any
		}{{index.TableEndpoints, ep}, {index.TableIdentities, &index.Identity{ID: id, Labels: ls, Key: ls.Key()}}} {
			if err := index.Insert(txn, r.table, r.obj); err != nil {
				b.Fatalf("%s: %v", r.table, err)
			}
		}
	}
	var docs []string
	for i := range 100 {
		docs = append(docs, fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: p%d, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: b%d}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: a}}]
    toPorts: [{ports: [{port: "80", protocol: TCP}]}]
`, i, i))
	}
	pols, err := policy.Parse([]byte(strings.Join(docs, "---\n")))
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range pols {
		if err := index.Insert(txn, index.TablePolicies, &index.PolicyRow{Key: p.Key(), Policy: p}); err != nil {
			b.Fatal(err)
		}
	}
	txn.Commit()
	s, err := New(Config{Index: ix, Rate: 1 << 30, Node: "n"})
	if err != nil {
		b.Fatal(err)
	}
	ev := flowEv(1000, 80, datapath.FlowForwarded)
	for _, enforced := range []bool{false, true} {
		b.Run(fmt.Sprintf("enforced=%v", enforced), func(b *testing.B) {
			ev.Enforced = enforced
			for b.Loop() {
				s.OnFlow(ev)
			}
		})
	}
}

func mustLabel(tb testing.TB, s string) labels.Label {
	tb.Helper()
	l, err := labels.Parse(s)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}
