package netpolmodel

import (
	"net/netip"
	"testing"
)

// TestModel checks the model on hand-worked verdicts of the spec, so
// that a table failure points at the agent, not at the model.
func TestModel(t *testing.T) {
	pod := func(ns, name, ip string) Pod {
		return Pod{NS: ns, Name: name, Labels: map[string]string{"pod": name}, IP: netip.MustParseAddr(ip)}
	}
	xa, xb, ya, yb := pod("x", "a", "10.0.0.1"), pod("x", "b", "10.0.0.2"), pod("y", "a", "10.0.0.3"), pod("y", "b", "10.0.0.4")
	tests := []struct {
		name     string
		pols     []*Policy
		src, dst Pod
		port     int
		proto    string
		want     bool
	}{
		{"no policy", nil, xa, xb, 80, "TCP", true},
		{"default deny ingress", []*Policy{NewPolicy("x", "d", EveryPod, ing)}, ya, xa, 80, "TCP", false},
		{"loopback always passes", []*Policy{NewPolicy("x", "d", EveryPod, ing, eg)}, xa, xa, 80, "TCP", true},
		{"egress deny of the source", []*Policy{NewPolicy("x", "d", EveryPod, eg)}, xa, ya, 80, "TCP", false},
		{"ingress of another namespace unaffected", []*Policy{NewPolicy("x", "d", EveryPod, ing)}, xa, ya, 80, "TCP", true},
		{"peer without namespaceSelector is the policy's namespace",
			[]*Policy{NewPolicy("x", "p", EveryPod, ing).WithIngress(From(Peer{PodSelector: SelP("pod", "b")}))}, yb, xa, 80, "TCP", false},
		{"AND in one peer", []*Policy{NewPolicy("x", "p", EveryPod, ing).WithIngress(From(Peer{NamespaceSelector: NSName("y"), PodSelector: SelP("pod", "b")}))}, ya, xa, 80, "TCP", false},
		{"ipBlock matches a pod address", []*Policy{NewPolicy("x", "p", EveryPod, ing).WithIngress(From(Block("10.0.0.4/32")))}, yb, xa, 80, "TCP", true},
		{"ipBlock except", []*Policy{NewPolicy("x", "p", EveryPod, ing).WithIngress(From(Block("10.0.0.0/24", "10.0.0.4/32")))}, yb, xa, 80, "TCP", false},
		{"port protocol defaults to TCP", []*Policy{NewPolicy("x", "p", EveryPod, ing).WithIngress(Rule{}.On(Port{Port: IntP(80)}))}, ya, xa, 80, "UDP", false},
		{"endPort range", []*Policy{NewPolicy("x", "p", EveryPod, ing).WithIngress(Rule{}.On(Port{Port: IntP(80), EndPort: IntP(81)}))}, ya, xa, 81, "TCP", true},
		{"default policyTypes: egress rules enforce egress",
			[]*Policy{NewPolicy("x", "p", EveryPod).WithEgress(To(Peer{PodSelector: SelP("pod", "b")}))}, xa, ya, 80, "TCP", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Allows(tt.pols, tt.src, tt.dst, tt.port, tt.proto); got != tt.want {
				t.Errorf("Allows = %v, want %v", got, tt.want)
			}
		})
	}
}
