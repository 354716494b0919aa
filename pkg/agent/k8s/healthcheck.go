package k8s

import (
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/membrane-cni/membrane/pkg/domain/service"
)

// healthChecks serves the health check node ports of the Services with
// externalTrafficPolicy Local, as kube-proxy and Cilium do: GET on a
// Service's spec.healthCheckNodePort answers 200 with the number of its
// local endpoints, 503 when this node has none, so that an external load
// balancer sends traffic only to nodes holding a backend. One listener
// per port on every host address; only the service watcher's worker
// calls set and closeAll.
type healthChecks struct {
	listen func(network, addr string) (net.Listener, error)
	log    *slog.Logger

	byKey map[string]*hcPort // service key -> its port (worker only)
}

// hcPort is one Service's health check port.
type hcPort struct {
	port     int
	ns, name string
	local    atomic.Int64
	srv      *http.Server // nil: the listen failed, retried at the next set
}

func newHealthChecks(listen func(network, addr string) (net.Listener, error), log *slog.Logger) *healthChecks {
	if listen == nil {
		listen = net.Listen
	}
	return &healthChecks{listen: listen, log: log, byKey: map[string]*hcPort{}}
}

// healthCheckOf returns svc's health check node port and how many of its
// backends (translated into out) are on this node; port 0: none.
func healthCheckOf(svc *corev1.Service, out []service.Service) (port, local int) {
	if svc == nil || svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal || svc.Spec.HealthCheckNodePort <= 0 ||
		svc.Spec.HealthCheckNodePort > 65535 {
		return 0, 0
	}
	seen := map[string]bool{}
	for _, s := range out {
		// The external scope: this node's endpoints as traffic from
		// outside gets them.
		if s.Kind != service.KindNodePort || s.Frontend.Scope != service.ScopeExternal {
			continue
		}
		for _, b := range s.Backends {
			if b.Local && !seen[b.Addr.String()] {
				seen[b.Addr.String()] = true
			}
		}
	}
	return int(svc.Spec.HealthCheckNodePort), len(seen)
}

// set makes key's health check port port (0: none) with local endpoints.
func (h *healthChecks) set(key, ns, name string, port, local int) {
	cur := h.byKey[key]
	if cur != nil && (cur.port != port || cur.srv == nil) {
		cur.close()
		delete(h.byKey, key)
		cur = nil
	}
	if port == 0 {
		return
	}
	if cur == nil {
		cur = &hcPort{port: port, ns: ns, name: name}
		lis, err := h.listen("tcp", ":"+strconv.Itoa(port))
		if err != nil {
			h.log.Warn("health check node port not served; retried when the service changes", "service", key, "port", port, "err", err)
		} else {
			cur.srv = &http.Server{Handler: cur, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second,
				WriteTimeout: 5 * time.Second, IdleTimeout: 30 * time.Second, MaxHeaderBytes: 4096}
			go func() { _ = cur.srv.Serve(lis) }()
		}
		h.byKey[key] = cur
	}
	cur.local.Store(int64(local))
}

// closeAll stops every listener.
func (h *healthChecks) closeAll() {
	for k, p := range h.byKey {
		p.close()
		delete(h.byKey, k)
	}
}

// close stops the listener; the worker closes a port once, as it
// leaves byKey.
func (p *hcPort) close() {
	if p.srv != nil {
		_ = p.srv.Close()
	}
}

// ServeHTTP answers as kube-proxy's health check server does.
func (p *hcPort) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	n := p.local.Load()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.FormatInt(n, 10))
	if n > 0 {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(map[string]any{
		"service":             map[string]string{"namespace": p.ns, "name": p.name},
		"localEndpoints":      n,
		"serviceProxyHealthy": true,
	})
}
