package k8s

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/membrane-cni/membrane/pkg/domain/service"
)

// TestHealthCheckNodePort: an externalTrafficPolicy Local Service's
// health check node port answers 200 with its local endpoints, 503
// without (kube-proxy's body), and stops answering once the Service has
// no health check port any more; other Services get none.
func TestHealthCheckNodePort(t *testing.T) {
	var addr string
	listen := func(network, _ string) (net.Listener, error) {
		l, err := net.Listen(network, "127.0.0.1:0")
		if err == nil {
			addr = l.Addr().String()
		}
		return l, err
	}
	h := newHealthChecks(listen, slog.New(slog.DiscardHandler))
	defer h.closeAll()
	get := func() (int, map[string]any, error) {
		resp, err := http.Get("http://" + addr + "/")
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var body map[string]any
		if err := json.Unmarshal(b, &body); err != nil {
			t.Fatalf("body %q: %v", b, err)
		}
		return resp.StatusCode, body, nil
	}
	svc := &corev1.Service{Spec: corev1.ServiceSpec{ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal, HealthCheckNodePort: 31999}}
	// The external scope's records count (ready local endpoints, else
	// serving terminating local ones); the internal scope's do not.
	ext := service.Frontend{Scope: service.ScopeExternal}
	local := []service.Service{{Kind: service.KindNodePort, TwoScopes: true, Backends: []service.Backend{
		{Addr: netip.MustParseAddr("10.244.0.6"), Port: 80, Local: true}, {Addr: netip.MustParseAddr("10.244.1.5"), Port: 80}}},
		{Frontend: ext, Kind: service.KindNodePort, Backends: []service.Backend{{Addr: netip.MustParseAddr("10.244.0.5"), Port: 80, Local: true}}},
		{Frontend: ext, Kind: service.KindNodePort, Backends: []service.Backend{{Addr: netip.MustParseAddr("10.244.0.5"), Port: 80, Local: true}}}}
	port, n := healthCheckOf(svc, local)
	if port != 31999 || n != 1 {
		t.Fatalf("healthCheckOf = %d, %d; want 31999, 1 (one local address over two external-scope frontends)", port, n)
	}
	h.set("ns/web", "ns", "web", port, n)
	code, body, err := get()
	if err != nil || code != http.StatusOK || body["localEndpoints"] != float64(1) {
		t.Errorf("with a local endpoint: %d %v %v; want 200 and localEndpoints 1", code, body, err)
	}
	if s, _ := body["service"].(map[string]any); s["namespace"] != "ns" || s["name"] != "web" {
		t.Errorf("body %v: want the service's namespace and name", body)
	}
	h.set("ns/web", "ns", "web", port, 0)
	if code, body, err := get(); err != nil || code != http.StatusServiceUnavailable || body["localEndpoints"] != float64(0) {
		t.Errorf("without local endpoints: %d %v %v; want 503 and localEndpoints 0", code, body, err)
	}
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	port, n = healthCheckOf(svc, local)
	if port != 0 {
		t.Errorf("externalTrafficPolicy Cluster: health check port %d, want none", port)
	}
	h.set("ns/web", "ns", "web", port, n)
	if _, _, err := get(); err == nil {
		t.Errorf("the port still answers once the Service has no health check port")
	}
}
