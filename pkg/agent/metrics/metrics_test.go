package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("scrape: %d", rec.Code)
	}
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

func TestScrape(t *testing.T) {
	m := New()
	// Without a sampler only the observed series and the runtime show.
	if body := scrape(t, m); strings.Contains(body, "membrane_endpoints{") || !strings.Contains(body, "go_goroutines") ||
		!strings.Contains(body, "\ngo_gc_heap_live_bytes ") || !strings.Contains(body, "\ngo_gc_gomemlimit_bytes ") ||
		!strings.Contains(body, "\ngo_cpu_classes_gc_total_cpu_seconds_total ") {
		t.Fatalf("scrape without a sampler:\n%s", body)
	}
	m.SetSampler(func() Sample {
		return Sample{
			EndpointsByState: map[string]int{"ready": 7, "regenerating": 1},
			MailboxDepth:     map[string]int64{"endpoint": 4}, MailboxDepthMax: map[string]int64{"endpoint": 3},
			IPAM:       map[string]IPAMSample{"ipv4": {Used: 8, Free: 245}},
			Identities: 2, DeleteQueue: -1, ProxyWaitTimeouts: 3, ProxyRejects: 1,
		}
	})
	m.ObserveRequest("GET /v1/endpoint", "GET", 200, 3*time.Millisecond)
	m.ObserveRequest("GET /v1/endpoint", "GET", 200, 30*time.Millisecond)
	m.RegenPhase("realize", 2*time.Millisecond)
	m.SetRestoreDuration(1500 * time.Millisecond)
	m.Drop("policy-denied", "ingress")
	m.Drop("policy-denied", "ingress")
	m.Drop("fragment", "egress")
	body := scrape(t, m)
	for _, want := range []string{
		`membrane_endpoints{state="ready"} 7`,
		`membrane_endpoints{state="regenerating"} 1`,
		`membrane_actor_mailbox_depth{kind="endpoint"} 4`,
		`membrane_actor_mailbox_depth_max{kind="endpoint"} 3`,
		`membrane_ipam_used_addresses{family="ipv4"} 8`,
		`membrane_ipam_free_addresses{family="ipv4"} 245`,
		`membrane_identities 2`,
		`membrane_proxy_wait_failures_total{result="timeout"} 3`,
		`membrane_proxy_wait_failures_total{result="rejected"} 1`,
		`membrane_restore_duration_seconds 1.5`,
		`membrane_api_request_duration_seconds_count{code="200",method="GET",route="GET /v1/endpoint"} 2`,
		`membrane_api_request_duration_seconds_bucket{code="200",method="GET",route="GET /v1/endpoint",le="0.005"} 1`,
		`membrane_endpoint_regeneration_duration_seconds_count{phase="realize"} 1`,
		`membrane_datapath_drop_notifications_total{direction="ingress",reason="policy-denied"} 2`,
		`membrane_datapath_drop_notifications_total{direction="egress",reason="fragment"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
	if strings.Contains(body, "membrane_cni_delete_queue_length") {
		t.Error("an unknown delete queue length was exported")
	}
	// Two Metrics do not share a registry (no global state).
	if other := scrape(t, New()); strings.Contains(other, `route="GET /v1/endpoint"`) {
		t.Error("a second Metrics sees the first one's series")
	}
}
