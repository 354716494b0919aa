package api_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

const apiPolicy = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: web
  namespace: ns
  labels: {team: web}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: client}}]
    toPorts: [{ports: [{port: "80", protocol: TCP}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db, namespace: ns, labels: {team: db}}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress: [{from: [{podSelector: {matchLabels: {app: web}}}], ports: [{port: 5432}]}]
`

func TestPolicyAPI(t *testing.T) {
	e := startHandlersAgent(t, nil)
	web := e.createPod(t, "c-web", "ns", "web", "k8s:app=web", "k8s:io.kubernetes.pod.namespace=ns")
	client := e.createPod(t, "c-client", "ns", "client", "k8s:app=client", "k8s:io.kubernetes.pod.namespace=ns")

	t.Run("bad documents import nothing", func(t *testing.T) {
		bad := apiPolicy + "---\n" + strings.Replace(apiPolicy[:strings.Index(apiPolicy, "---")], "name: web", "name: web2", 1) +
			"  egress: [{toNodes: [{matchLabels: {a: b}}]}]\n"
		expectError(t, e.do(t, http.MethodPut, "/v1/policy", bad), http.StatusBadRequest, "invalid-policy", `spec.egress[0].toNodes: needs --enable-node-selector-labels`)
		expectError(t, e.do(t, http.MethodPut, "/v1/policy", bad), http.StatusBadRequest, "invalid-policy", "document 3 (CiliumNetworkPolicy ns/web2)")
		var list models.PolicyList
		decodeInto(t, e.do(t, http.MethodGet, "/v1/policy", ""), &list)
		if list.Revision != 0 || len(list.Policies) != 0 {
			t.Fatalf("after a refused import: %+v", list)
		}
		req, _ := http.NewRequest(http.MethodPut, "http://membrane/v1/policy", strings.NewReader(apiPolicy))
		req.Header.Set("Content-Type", "application/json")
		resp, err := e.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("YAML sent as application/json: status %d, want 400", resp.StatusCode)
		}
	})
	t.Run("import, list, endpoint policy", func(t *testing.T) {
		res, err := e.client.PolicyImport(bg(t), []byte(apiPolicy), "application/yaml")
		if err != nil {
			t.Fatal(err)
		}
		if res.Revision != 1 || strings.Join(res.Policies, ",") != "ns/web,ns/db" {
			t.Fatalf("import = %+v", res)
		}
		list, err := e.client.PolicyList(bg(t))
		if err != nil {
			t.Fatal(err)
		}
		if list.Revision != 1 || len(list.Policies) != 2 || list.Policies[1].Name != "web" || list.Policies[1].Kind != "CiliumNetworkPolicy" ||
			list.Policies[1].Labels["team"] != "web" || !json.Valid(list.Policies[1].Spec) || !strings.Contains(string(list.Policies[1].Spec), "endpointSelector") {
			t.Fatalf("list = %+v", list)
		}
		testutil.Eventually(t, "web's policy realised", func() bool {
			p, err := e.client.EndpointPolicy(bg(t), "pod-name:ns/web")
			return err == nil && p.RealizedIngressEnforced && len(p.Realized) == 1
		})
		p, err := e.client.EndpointPolicy(bg(t), "pod-name:ns/web")
		if err != nil {
			t.Fatal(err)
		}
		want := models.PolicyEntry{Identity: uint32(client.Identity.ID), Port: 80, Protocol: "TCP", Direction: "ingress"}
		if p.ID != web.ID || p.PolicyRevision != 1 || !p.IngressEnforced || p.EgressEnforced ||
			len(p.Computed) != 1 || p.Computed[0] != want || p.Realized[0].PolicyEntry != want ||
			p.Drops == nil || len(p.Drops) != 0 || p.DropsError != "" {
			t.Fatalf("endpoint policy = %+v", p)
		}
		var raw map[string]any
		decodeInto(t, e.do(t, http.MethodGet, "/v1/endpoint/"+strconv.FormatInt(web.ID, 10)+"/policy", ""), &raw)
		for _, k := range []string{"id", "identity", "policy-revision", "ingress-enforced", "egress-enforced", "computed", "realized", "drops"} {
			if _, ok := raw[k]; !ok {
				t.Errorf("GET /v1/endpoint/{id}/policy lacks %q: %v", k, raw)
			}
		}
	})
	t.Run("drops", func(t *testing.T) {
		// The fake datapath forwards nothing, so it drops nothing: an
		// empty list, not null.
		res := e.do(t, http.MethodGet, "/v1/drops", "")
		if res.status != http.StatusOK || strings.TrimSpace(string(res.body)) != "[]" {
			t.Fatalf("GET /v1/drops = %d %s", res.status, res.body)
		}
		if res := e.do(t, http.MethodGet, "/v1/drops?endpoint=1", ""); res.status != http.StatusBadRequest {
			t.Fatalf("GET /v1/drops?endpoint=1 = %d %s, want 400", res.status, res.body)
		}
	})
	t.Run("ipcache", func(t *testing.T) {
		rows, err := e.client.IPCache(bg(t))
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, r := range rows {
			if r.CIDR == web.Addressing.IPv4+"/32" && r.Identity == uint32(web.Identity.ID) && r.Source == "endpoint" {
				found = true
			}
		}
		if !found {
			t.Errorf("ipcache %+v lacks web's address", rows)
		}
	})
	t.Run("delete", func(t *testing.T) {
		expectError(t, e.do(t, http.MethodDelete, "/v1/policy?name=ns/nope", ""), http.StatusNotFound, "not-found", "ns/nope")
		expectError(t, e.do(t, http.MethodDelete, "/v1/policy", ""), http.StatusBadRequest, "invalid-argument", "exactly one")
		expectError(t, e.do(t, http.MethodDelete, "/v1/policy?name=a&labels=b=c", ""), http.StatusBadRequest, "invalid-argument", "exactly one")
		expectError(t, e.do(t, http.MethodDelete, "/v1/policy?labels=nokey", ""), http.StatusBadRequest, "invalid-argument", "key=value")
		expectError(t, e.do(t, http.MethodDelete, "/v1/policy?foo=1", ""), http.StatusBadRequest, "invalid-argument", "foo")
		res, err := e.client.PolicyDeleteByLabels(bg(t), map[string]string{"team": "db"})
		if err != nil || res.Deleted != 1 || res.Revision != 2 {
			t.Fatalf("delete by labels = %+v, %v", res, err)
		}
		res, err = e.client.PolicyDelete(bg(t), "ns/web")
		if err != nil || res.Deleted != 1 || res.Revision != 3 {
			t.Fatalf("delete by name = %+v, %v", res, err)
		}
		testutil.Eventually(t, "web back to allow-all", func() bool {
			p, err := e.client.EndpointPolicy(bg(t), "pod-name:ns/web")
			return err == nil && !p.RealizedIngressEnforced && len(p.Realized) == 0 && len(p.Computed) == 0
		})
	})
	t.Run("cidr entries", func(t *testing.T) {
		const doc = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-egress, namespace: ns}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Egress]
  egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}}], ports: [{port: 443}]}]
`
		if _, err := e.client.PolicyImport(bg(t), []byte(doc), "application/yaml"); err != nil {
			t.Fatal(err)
		}
		want := []models.CIDRPolicyEntry{
			{CIDR: "10.0.0.0/8", Port: 443, Protocol: "TCP", Direction: "egress", Allow: true},
			{CIDR: "10.1.0.0/16", Port: 443, Protocol: "TCP", Direction: "egress"},
		}
		testutil.Eventually(t, "web's CIDR entries realised", func() bool {
			p, err := e.client.EndpointPolicy(bg(t), "pod-name:ns/web")
			return err == nil && len(p.RealizedCIDR) == len(want)
		})
		p, err := e.client.EndpointPolicy(bg(t), "pod-name:ns/web")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(p.ComputedCIDR, want) || p.RealizedCIDR[0].CIDRPolicyEntry != want[0] || p.RealizedCIDR[1].CIDRPolicyEntry != want[1] {
			t.Fatalf("computed-cidr %+v, realized-cidr %+v, want %+v", p.ComputedCIDR, p.RealizedCIDR, want)
		}
		if _, err := e.client.PolicyDelete(bg(t), "ns/web-egress"); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, "web's CIDR entries gone", func() bool {
			p, err := e.client.EndpointPolicy(bg(t), "pod-name:ns/web")
			return err == nil && p.RealizedCIDR != nil && len(p.RealizedCIDR) == 0 && len(p.ComputedCIDR) == 0
		})
	})
	t.Run("errors", func(t *testing.T) {
		expectError(t, e.do(t, http.MethodGet, "/v1/endpoint/999/policy", ""), http.StatusNotFound, "not-found", "")
		expectError(t, e.do(t, http.MethodPost, "/v1/policy", "x"), http.StatusMethodNotAllowed, "method-not-allowed", "")
		expectError(t, e.do(t, http.MethodPut, "/v1/policy", ""), http.StatusBadRequest, "invalid-policy", "no policy documents")
	})
}
