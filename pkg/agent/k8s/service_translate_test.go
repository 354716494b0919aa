package k8s

import (
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/membrane-cni/membrane/pkg/domain/service"
)

func ptr[T any](v T) *T { return &v }

func testSlice(family discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}, AddressType: family, Ports: ports, Endpoints: eps}
}

func ep(addr, node string, ready *bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{addr}, NodeName: ptr(node), Conditions: discoveryv1.EndpointConditions{Ready: ready}}
}

// summary is frontend -> "backend,backend" for compact comparisons.
func summary(svcs []service.Service) map[string]string {
	out := map[string]string{}
	for _, s := range svcs {
		v := s.Kind + ":"
		for i, b := range s.Backends {
			if i > 0 {
				v += ","
			}
			v += b.String()
		}
		out[s.Frontend.String()] = v
	}
	return out
}

func TestTranslateService(t *testing.T) {
	ports := []discoveryv1.EndpointPort{
		{Name: ptr("http"), Port: ptr[int32](8080), Protocol: ptr(corev1.ProtocolTCP)},
		{Name: ptr("dns"), Port: ptr[int32](5353), Protocol: ptr(corev1.ProtocolUDP)},
	}
	v4 := testSlice(discoveryv1.AddressTypeIPv4, ports,
		ep("10.0.0.1", "n1", nil), ep("10.0.0.2", "n2", ptr(true)), ep("10.0.0.3", "n1", ptr(false)))
	v6 := testSlice(discoveryv1.AddressTypeIPv6, ports, ep("fd00::1", "n1", ptr(true)))
	base := func() *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1", "fd00:96::1"},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, NodePort: 30080},
				{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
				{Name: "sctp", Port: 9, Protocol: corev1.ProtocolSCTP},
			}}}
	}
	node := []netip.Addr{netip.MustParseAddr("192.0.2.1")}
	for _, tc := range []struct {
		name   string
		view   serviceView
		mutate func(*corev1.Service)
		want   map[string]string
	}{
		{"cluster IPs, ready endpoints, ports by name; no NodePort without replacement", serviceView{node: "n1", nodeAddrs: node}, nil, map[string]string{
			"10.96.0.1:80/TCP":    "ClusterIP:10.0.0.1:8080,10.0.0.2:8080",
			"10.96.0.1:53/UDP":    "ClusterIP:10.0.0.1:5353,10.0.0.2:5353",
			"[fd00:96::1]:80/TCP": "ClusterIP:[fd00::1]:8080",
			"[fd00:96::1]:53/UDP": "ClusterIP:[fd00::1]:5353",
		}},
		{"replacement adds the NodePort", serviceView{node: "n1", nodeAddrs: node, replacement: true}, nil, map[string]string{
			"10.96.0.1:80/TCP":    "ClusterIP:10.0.0.1:8080,10.0.0.2:8080",
			"10.96.0.1:53/UDP":    "ClusterIP:10.0.0.1:5353,10.0.0.2:5353",
			"[fd00:96::1]:80/TCP": "ClusterIP:[fd00::1]:8080",
			"[fd00:96::1]:53/UDP": "ClusterIP:[fd00::1]:5353",
			"192.0.2.1:30080/TCP": "NodePort:10.0.0.1:8080,10.0.0.2:8080",
		}},
		{"externalTrafficPolicy Local: the NodePort's external scope keeps this node's endpoints, its internal one all", serviceView{node: "n1", nodeAddrs: node, replacement: true},
			func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.ClusterIPs = s.Spec.ClusterIPs[:1]
				s.Spec.Ports = s.Spec.Ports[:1]
			}, map[string]string{
				"10.96.0.1:80/TCP":             "ClusterIP:10.0.0.1:8080,10.0.0.2:8080",
				"192.0.2.1:30080/TCP":          "NodePort:10.0.0.1:8080,10.0.0.2:8080",
				"192.0.2.1:30080/TCP/external": "NodePort:10.0.0.1:8080",
			}},
		{"internalTrafficPolicy Local: the cluster IP keeps this node's endpoints", serviceView{node: "n2"},
			func(s *corev1.Service) {
				s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
				s.Spec.ClusterIPs = s.Spec.ClusterIPs[:1]
				s.Spec.Ports = s.Spec.Ports[:1]
			}, map[string]string{"10.96.0.1:80/TCP": "ClusterIP:10.0.0.2:8080"}},
		{"a port no slice names has no backends", serviceView{node: "n1"},
			func(s *corev1.Service) {
				s.Spec.ClusterIPs = s.Spec.ClusterIPs[:1]
				s.Spec.Ports = []corev1.ServicePort{{Name: "other", Port: 81, Protocol: corev1.ProtocolTCP}}
			}, map[string]string{"10.96.0.1:81/TCP": "ClusterIP:"}},
		{"headless", serviceView{}, func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} }, map[string]string{}},
		{"external name", serviceView{}, func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName }, map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := base()
			if tc.mutate != nil {
				tc.mutate(s)
			}
			got := summary(tc.view.translate(s, []*discoveryv1.EndpointSlice{v4, v6}))
			if len(got) != len(tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			for k, w := range tc.want {
				if got[k] != w {
					t.Errorf("%s: got %q, want %q", k, got[k], w)
				}
			}
		})
	}
}

func TestTranslateAffinity(t *testing.T) {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}, Spec: corev1.ServiceSpec{
		ClusterIP: "10.96.0.1", SessionAffinity: corev1.ServiceAffinityClientIP,
		Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	v := serviceView{}
	if got := v.translate(s, nil); len(got) != 1 || got[0].Affinity != defaultAffinity {
		t.Fatalf("ClientIP without a timeout: %+v, want %s", got, defaultAffinity)
	}
	s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr[int32](60)}}
	got := v.translate(s, nil)
	if len(got) != 1 || got[0].Affinity != time.Minute {
		t.Fatalf("ClientIP 60 s: %+v", got)
	}
	if err := got[0].Validate(); err != nil {
		t.Errorf("translated service invalid: %v", err)
	}
}

// TestTranslateLocalBackends: a backend whose endpoint names this node is
// Local (NodePort traffic from outside reaches it without SNAT), others
// are not.
func TestTranslateLocalBackends(t *testing.T) {
	port := []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr[int32](8080), Protocol: ptr(corev1.ProtocolTCP)}}
	slice := testSlice(discoveryv1.AddressTypeIPv4, port, ep("10.0.0.1", "n1", nil), ep("10.0.0.2", "n2", nil))
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.0.1",
		Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, NodePort: 30080}}}}
	v := serviceView{node: "n1", nodeAddrs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}, replacement: true}
	got := v.translate(svc, []*discoveryv1.EndpointSlice{slice})
	if len(got) != 2 {
		t.Fatalf("frontends %v, want the cluster IP and the NodePort", summary(got))
	}
	for _, s := range got {
		want := []service.Backend{{Addr: netip.MustParseAddr("10.0.0.1"), Port: 8080, Local: true}, {Addr: netip.MustParseAddr("10.0.0.2"), Port: 8080}}
		if len(s.Backends) != 2 || s.Backends[0] != want[0] || s.Backends[1] != want[1] {
			t.Errorf("%s: backends %+v, want %+v", s.Frontend, s.Backends, want)
		}
	}
}

// TestTranslateTerminatingFallback: with no ready endpoint among those
// the traffic policy allows, the serving terminating ones are the
// backends (kube-proxy's fallback, upstream's "should fallback to
// terminating endpoints" specs); ready ones win when there are any, and
// terminating ones that stopped serving never serve.
func TestTranslateTerminatingFallback(t *testing.T) {
	port := []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr[int32](8080), Protocol: ptr(corev1.ProtocolTCP)}}
	term := func(addr, node string, serving bool) discoveryv1.Endpoint {
		e := ep(addr, node, ptr(false))
		e.Conditions.Serving, e.Conditions.Terminating = ptr(serving), ptr(true)
		return e
	}
	svc := func(etp corev1.ServiceExternalTrafficPolicy) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.0.1", ExternalTrafficPolicy: etp,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, NodePort: 30080}}}}
	}
	v := serviceView{node: "n1", nodeAddrs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}, replacement: true}
	for _, tc := range []struct {
		name string
		etp  corev1.ServiceExternalTrafficPolicy
		eps  []discoveryv1.Endpoint
		want map[string]string
	}{
		{"ready wins", corev1.ServiceExternalTrafficPolicyCluster,
			[]discoveryv1.Endpoint{ep("10.0.0.1", "n2", ptr(true)), term("10.0.0.2", "n1", true)},
			map[string]string{"10.96.0.1:80/TCP": "ClusterIP:10.0.0.1:8080", "192.0.2.1:30080/TCP": "NodePort:10.0.0.1:8080"}},
		{"no ready: serving terminating", corev1.ServiceExternalTrafficPolicyCluster,
			[]discoveryv1.Endpoint{ep("10.0.0.1", "n2", ptr(false)), term("10.0.0.2", "n1", true), term("10.0.0.3", "n2", false)},
			map[string]string{"10.96.0.1:80/TCP": "ClusterIP:10.0.0.2:8080", "192.0.2.1:30080/TCP": "NodePort:10.0.0.2:8080"}},
		{"local: no local ready, local serving terminating", corev1.ServiceExternalTrafficPolicyLocal,
			[]discoveryv1.Endpoint{ep("10.0.0.1", "n2", ptr(true)), term("10.0.0.2", "n1", true)},
			map[string]string{"10.96.0.1:80/TCP": "ClusterIP:10.0.0.1:8080", "192.0.2.1:30080/TCP": "NodePort:10.0.0.1:8080",
				"192.0.2.1:30080/TCP/external": "NodePort:10.0.0.2:8080"}},
	} {
		got := summary(v.translate(svc(tc.etp), []*discoveryv1.EndpointSlice{testSlice(discoveryv1.AddressTypeIPv4, port, tc.eps...)}))
		if len(got) != len(tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
			continue
		}
		for k, w := range tc.want {
			if got[k] != w {
				t.Errorf("%s: %s = %q, want %q", tc.name, k, got[k], w)
			}
		}
	}
}

// TestTranslateTwoScopes: externalTrafficPolicy Local gives each node
// port and external address two records, the internal one (every
// endpoint: the node's sockets and pods, kube-proxy's short-circuit;
// flagged TwoScopes) and the external one (this node's endpoints, none
// on a node without one: traffic from outside is refused there).
// internalTrafficPolicy Local trims only the cluster address; Cluster
// policies keep one record per frontend.
func TestTranslateTwoScopes(t *testing.T) {
	port := []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr[int32](8080), Protocol: ptr(corev1.ProtocolTCP)}}
	slice := testSlice(discoveryv1.AddressTypeIPv4, port, ep("10.0.0.1", "n1", nil), ep("10.0.0.2", "n2", nil))
	svc := func(etp corev1.ServiceExternalTrafficPolicy, itp corev1.ServiceInternalTrafficPolicy) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.1", ExternalTrafficPolicy: etp, InternalTrafficPolicy: &itp,
			ExternalIPs: []string{"203.0.113.7"},
			Ports:       []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, NodePort: 30080}}}}
	}
	view := func(node string) serviceView {
		return serviceView{node: node, nodeAddrs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}, replacement: true}
	}
	const local, cluster = corev1.ServiceExternalTrafficPolicyLocal, corev1.ServiceExternalTrafficPolicyCluster
	for _, tc := range []struct {
		name string
		node string
		etp  corev1.ServiceExternalTrafficPolicy
		itp  corev1.ServiceInternalTrafficPolicy
		want map[string]string
	}{
		{"ETP Local, a node without a local endpoint", "n3", local, corev1.ServiceInternalTrafficPolicyCluster, map[string]string{
			"10.96.0.1:80/TCP":             "ClusterIP:10.0.0.1:8080,10.0.0.2:8080",
			"192.0.2.1:30080/TCP":          "NodePort:10.0.0.1:8080,10.0.0.2:8080",
			"192.0.2.1:30080/TCP/external": "NodePort:",
			"203.0.113.7:80/TCP":           "ExternalIP:10.0.0.1:8080,10.0.0.2:8080",
			"203.0.113.7:80/TCP/external":  "ExternalIP:",
		}},
		{"ETP Local, a node with one", "n2", local, corev1.ServiceInternalTrafficPolicyCluster, map[string]string{
			"10.96.0.1:80/TCP":             "ClusterIP:10.0.0.1:8080,10.0.0.2:8080",
			"192.0.2.1:30080/TCP":          "NodePort:10.0.0.1:8080,10.0.0.2:8080",
			"192.0.2.1:30080/TCP/external": "NodePort:10.0.0.2:8080",
			"203.0.113.7:80/TCP":           "ExternalIP:10.0.0.1:8080,10.0.0.2:8080",
			"203.0.113.7:80/TCP/external":  "ExternalIP:10.0.0.2:8080",
		}},
		{"ETP and ITP Local: only the cluster address is trimmed", "n2", local, corev1.ServiceInternalTrafficPolicyLocal, map[string]string{
			"10.96.0.1:80/TCP":             "ClusterIP:10.0.0.2:8080",
			"192.0.2.1:30080/TCP":          "NodePort:10.0.0.1:8080,10.0.0.2:8080",
			"192.0.2.1:30080/TCP/external": "NodePort:10.0.0.2:8080",
			"203.0.113.7:80/TCP":           "ExternalIP:10.0.0.1:8080,10.0.0.2:8080",
			"203.0.113.7:80/TCP/external":  "ExternalIP:10.0.0.2:8080",
		}},
		{"ETP Cluster: one scope", "n3", cluster, corev1.ServiceInternalTrafficPolicyCluster, map[string]string{
			"10.96.0.1:80/TCP":    "ClusterIP:10.0.0.1:8080,10.0.0.2:8080",
			"192.0.2.1:30080/TCP": "NodePort:10.0.0.1:8080,10.0.0.2:8080",
			"203.0.113.7:80/TCP":  "ExternalIP:10.0.0.1:8080,10.0.0.2:8080",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := view(tc.node)
			out := v.translate(svc(tc.etp, tc.itp), []*discoveryv1.EndpointSlice{slice})
			got := summary(out)
			if len(got) != len(tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			for k, w := range tc.want {
				if got[k] != w {
					t.Errorf("%s: got %q, want %q", k, got[k], w)
				}
			}
			for _, s := range out {
				if err := s.Validate(); err != nil {
					t.Errorf("%s invalid: %v", s.Frontend, err)
				}
				two := tc.etp == local && s.Kind != service.KindClusterIP && s.Frontend.Scope == service.ScopeInternal
				if s.TwoScopes != two {
					t.Errorf("%s: TwoScopes %v, want %v", s.Frontend, s.TwoScopes, two)
				}
			}
		})
	}
}
