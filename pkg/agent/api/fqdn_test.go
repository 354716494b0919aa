package api_test

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// TestFQDNCacheAPI: GET /v1/fqdn/cache lists what the agent learned,
// filtered by endpoint and matchpattern; bad filters are 400.
func TestFQDNCacheAPI(t *testing.T) {
	e := startHandlersAgent(t, nil)
	pod := e.createPod(t, "c-a", "default", "a", "k8s:app=a", "k8s:io.kubernetes.pod.namespace=default")
	ctx := context.Background()
	if err := e.agent.System.LearnFQDN(ctx, endpoint.ID(pod.ID), "Allowed.Test", []netip.Addr{netip.MustParseAddr("192.0.2.10")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	var got []models.FQDNCacheEntry
	decodeInto(t, e.do(t, http.MethodGet, "/v1/fqdn/cache", ""), &got)
	if len(got) != 1 || got[0].FQDN != "allowed.test." || got[0].IP != "192.0.2.10" || got[0].Endpoint != uint16(pod.ID) ||
		got[0].TTL < 3500 || got[0].TTL > 3600 {
		t.Fatalf("GET /v1/fqdn/cache = %+v", got)
	}
	for _, q := range []string{"?matchpattern=*.other", "?endpoint=999"} {
		decodeInto(t, e.do(t, http.MethodGet, "/v1/fqdn/cache"+q, ""), &got)
		if len(got) != 0 {
			t.Errorf("%s: %+v, want none", q, got)
		}
	}
	decodeInto(t, e.do(t, http.MethodGet, "/v1/fqdn/cache?matchpattern=*.test", ""), &got)
	if len(got) != 1 {
		t.Errorf("matchpattern *.test: %+v", got)
	}
	expectError(t, e.do(t, http.MethodGet, "/v1/fqdn/cache?endpoint=x", ""), http.StatusBadRequest, "invalid-argument", `"endpoint"`)
	expectError(t, e.do(t, http.MethodGet, "/v1/fqdn/cache?matchpattern=a**", ""), http.StatusBadRequest, "invalid-argument", "matchpattern")
	expectError(t, e.do(t, http.MethodGet, "/v1/fqdn/cache?x=1", ""), http.StatusBadRequest, "invalid-argument", "unknown query parameter")

	// The endpoint's policy view shows the entries redirected to the DNS
	// proxy with their names.
	doc := `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: dns, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: a}}
  egress:
  - toEntities: [world]
    toPorts: [{ports: [{port: "53", protocol: UDP}], rules: {dns: [{matchPattern: "*.test"}]}}]
`
	if _, err := e.client.PolicyImport(ctx, []byte(doc), "application/yaml"); err != nil {
		t.Fatal(err)
	}
	var pol models.EndpointPolicy
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		decodeInto(t, e.do(t, http.MethodGet, fmt.Sprintf("/v1/endpoint/%d/policy", pod.ID), ""), &pol)
		if len(pol.ComputedDNS) > 0 || time.Now().After(deadline) {
			break // the regeneration published the new policy, or never will
		}
	}
	if len(pol.ComputedDNS) != 1 || pol.ComputedDNS[0].Port != 53 || len(pol.ComputedDNS[0].Names) != 1 || pol.ComputedDNS[0].Names[0] != "pattern:*.test." {
		t.Fatalf("computed-dns = %+v", pol.ComputedDNS)
	}
}
