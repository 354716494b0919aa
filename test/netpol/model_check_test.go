package netpol

import (
	"net/netip"
	"testing"
)

// TestModel checks the model on hand-worked verdicts of the spec, so
// that a table failure points at the agent, not at the model.
func TestModel(t *testing.T) {
	pod := func(ns, name, ip string) modelPod {
		return modelPod{ns: ns, name: name, labels: map[string]string{"pod": name}, ip: netip.MustParseAddr(ip)}
	}
	xa, xb, ya, yb := pod("x", "a", "10.0.0.1"), pod("x", "b", "10.0.0.2"), pod("y", "a", "10.0.0.3"), pod("y", "b", "10.0.0.4")
	tests := []struct {
		name     string
		pols     []*netPolicy
		src, dst modelPod
		port     int
		proto    string
		want     bool
	}{
		{"no policy", nil, xa, xb, 80, "TCP", true},
		{"default deny ingress", []*netPolicy{newPolicy("x", "d", everyPod, ing)}, ya, xa, 80, "TCP", false},
		{"loopback always passes", []*netPolicy{newPolicy("x", "d", everyPod, ing, eg)}, xa, xa, 80, "TCP", true},
		{"egress deny of the source", []*netPolicy{newPolicy("x", "d", everyPod, eg)}, xa, ya, 80, "TCP", false},
		{"ingress of another namespace unaffected", []*netPolicy{newPolicy("x", "d", everyPod, ing)}, xa, ya, 80, "TCP", true},
		{"peer without namespaceSelector is the policy's namespace",
			[]*netPolicy{newPolicy("x", "p", everyPod, ing).ingress(from(npPeer{PodSelector: selp("pod", "b")}))}, yb, xa, 80, "TCP", false},
		{"AND in one peer", []*netPolicy{newPolicy("x", "p", everyPod, ing).ingress(from(npPeer{NamespaceSelector: nsName("y"), PodSelector: selp("pod", "b")}))}, ya, xa, 80, "TCP", false},
		{"ipBlock matches a pod address", []*netPolicy{newPolicy("x", "p", everyPod, ing).ingress(from(block("10.0.0.4/32")))}, yb, xa, 80, "TCP", true},
		{"ipBlock except", []*netPolicy{newPolicy("x", "p", everyPod, ing).ingress(from(block("10.0.0.0/24", "10.0.0.4/32")))}, yb, xa, 80, "TCP", false},
		{"port protocol defaults to TCP", []*netPolicy{newPolicy("x", "p", everyPod, ing).ingress(npRule{}.on(npPort{Port: intp(80)}))}, ya, xa, 80, "UDP", false},
		{"endPort range", []*netPolicy{newPolicy("x", "p", everyPod, ing).ingress(npRule{}.on(npPort{Port: intp(80), EndPort: intp(81)}))}, ya, xa, 81, "TCP", true},
		{"default policyTypes: egress rules enforce egress",
			[]*netPolicy{newPolicy("x", "p", everyPod).egress(to(npPeer{PodSelector: selp("pod", "b")}))}, xa, ya, 80, "TCP", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := modelAllows(tt.pols, tt.src, tt.dst, tt.port, tt.proto); got != tt.want {
				t.Errorf("modelAllows = %v, want %v", got, tt.want)
			}
		})
	}
}
