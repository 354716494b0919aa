package policy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// benchRepo builds a repository with n identities (app=app<i%50>, apps
// 10k..10k+9 in namespace ns<k>) and 50 CNPs: app<k> accepts app<k+1> on TCP 8080 and
// the host, and may reach app<k+2> and 10.<k>.0.0/16.
func benchRepo(b *testing.B, n int) *Repository {
	b.Helper()
	r := NewRepository()
	for i := 0; i < n; i++ {
		r.UpsertIdentity(identity.NumericIdentity(256+i), podLabels(b, fmt.Sprintf("ns%d", (i%50)/10), fmt.Sprintf("app=app%d", i%50), fmt.Sprintf("id=%d", i)))
	}
	var docs []string
	for ns := 0; ns < 5; ns++ {
		for k := 0; k < 10; k++ {
			app := k + 10*ns
			docs = append(docs, fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: p%d, namespace: ns%d}
spec:
  endpointSelector: {matchLabels: {app: app%d}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: app%d}}]
    toPorts: [{ports: [{port: "8080", protocol: TCP}]}]
  - fromEntities: [host]
  egress:
  - toEndpoints: [{matchLabels: {app: app%d}}]
  - toCIDR: [10.%d.0.0/16]
`, app, ns, app, (app+1)%50, (app+2)%50, app))
		}
	}
	r.Import(mustParse(b, strings.Join(docs, "---\n")))
	return r
}

// BenchmarkComputePolicy: computing the policy of every identity from
// the rules and the selector cache (cache of computed policies cleared).
func BenchmarkComputePolicy(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("identities=%d", n), func(b *testing.B) {
			r := benchRepo(b, n)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				clear(r.mapStates)
				r.bySubjects = nil
				for id := identity.NumericIdentity(256); id < identity.NumericIdentity(256+n); id++ {
					r.MapState(id)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/identity")
		})
	}
}

// BenchmarkImportOne: re-importing one policy with every identity's
// policy cached: only its subjects are recomputed.
func BenchmarkImportOne(b *testing.B) {
	r := benchRepo(b, 10000)
	for id := identity.NumericIdentity(256); id < 256+10000; id++ {
		r.MapState(id)
	}
	docs := [2][]*Policy{}
	for j := range docs {
		docs[j] = mustParse(b, fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: p0, namespace: ns0}
spec:
  endpointSelector: {matchLabels: {app: app0}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: app1}}]
    toPorts: [{ports: [{port: "%d", protocol: TCP}]}]
`, 9000+j))
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if res := r.Import(docs[i%2]); len(res.Changed) == 0 {
			b.Fatal("nothing changed")
		}
	}
}
