package identity

import (
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// mustLabels parses ss into a label set or fails the test.
func mustLabels(tb testing.TB, ss ...string) labels.Labels {
	tb.Helper()
	ls, err := labels.ParseSet(ss)
	if err != nil {
		tb.Fatalf("ParseSet(%q): %v", ss, err)
	}
	return ls
}

func TestReserved(t *testing.T) {
	tests := []struct {
		id     NumericIdentity
		label  string
		str    string
		hasLbl bool
	}{
		{IdentityUnknown, "", "unknown", false},
		{ReservedHost, "reserved:host", "host", true},
		{ReservedWorld, "reserved:world", "world", true},
		{ReservedUnmanaged, "reserved:unmanaged", "unmanaged", true},
		{ReservedHealth, "reserved:health", "health", true},
		{ReservedInit, "reserved:init", "init", true},
		{ReservedRemoteNode, "reserved:remote-node", "remote-node", true},
		{ReservedIngress, "reserved:ingress", "ingress", true},
		{9, "", "9", false},
		{255, "", "255", false},
		{MinLocalIdentity, "", "256", false},
	}
	for _, tt := range tests {
		t.Run(tt.str, func(t *testing.T) {
			if got := tt.id.String(); got != tt.str {
				t.Errorf("String() = %q, want %q", got, tt.str)
			}
			wantReserved := tt.id != IdentityUnknown && tt.id < MinLocalIdentity
			if got := tt.id.IsReserved(); got != wantReserved {
				t.Errorf("IsReserved() = %v, want %v", got, wantReserved)
			}
			ls, ok := ReservedLabels(tt.id)
			if ok != tt.hasLbl || (ok && ls.Key() != tt.label) {
				t.Fatalf("ReservedLabels(%d) = %v, %v; want %q, %v", tt.id, ls, ok, tt.label, tt.hasLbl)
			}
			if !ok {
				return
			}
			if got, ok := LookupReserved(mustLabels(t, tt.label)); !ok || got != tt.id {
				t.Fatalf("LookupReserved(%s) = %d, %v; want %d", tt.label, got, ok, tt.id)
			}
		})
	}
}

func TestLookupReservedRejects(t *testing.T) {
	tests := []struct {
		name string
		in   []string
	}{
		{"empty", nil},
		{"extra label", []string{"reserved:host", "k8s:app=web"}},
		{"unknown name", []string{"reserved:foo"}},
		{"value set", []string{"reserved:host=x"}},
		{"other source", []string{"k8s:host"}},
		{"two reserved", []string{"reserved:host", "reserved:world"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if id, ok := LookupReserved(mustLabels(t, tt.in...)); ok {
				t.Fatalf("LookupReserved(%q) = %d, want no reserved identity", tt.in, id)
			}
		})
	}
}

func TestReservedRemoteNodeKubeAPIServer(t *testing.T) {
	ls, ok := ReservedLabels(ReservedKubeAPIServer)
	if !ok || ls.String() != "reserved:kube-apiserver;reserved:remote-node" {
		t.Fatalf("kube-apiserver labels %v", ls)
	}
	if id, ok := LookupReserved(ls); !ok || id != ReservedKubeAPIServer {
		t.Fatalf("LookupReserved(%v) = %v %v", ls, id, ok)
	}
	for _, one := range []string{"kube-apiserver", "remote-node"} {
		l := labels.Labels{{Source: labels.SourceReserved, Key: one}}
		id, ok := LookupReserved(l)
		if one == "kube-apiserver" && ok {
			t.Errorf("{reserved:kube-apiserver} alone is identity %v", id)
		}
		if one == "remote-node" && (!ok || id != ReservedRemoteNode) {
			t.Errorf("{reserved:remote-node} = %v %v", id, ok)
		}
	}
	if ReservedRemoteNode.String() != "remote-node" || ReservedKubeAPIServer.String() != "kube-apiserver" {
		t.Error("names")
	}
}
