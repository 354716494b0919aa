package endpoint

import (
	"testing"
)

func TestClone(t *testing.T) {
	orig := &Endpoint{ID: 7, ContainerID: "c", State: StateReady}
	c := orig.Clone()
	c.State, c.ContainerID = StateDisconnecting, "d"
	if orig.State != StateReady || orig.ContainerID != "c" {
		t.Fatalf("modifying a clone changed the original: %+v", orig)
	}
}

func TestPodKey(t *testing.T) {
	tests := []struct {
		ns, pod, want string
	}{
		{"", "", ""},
		{"ns", "pod", "ns/pod"},
		{"ns", "", "ns/"},
		{"", "pod", "/pod"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			e := &Endpoint{Namespace: tt.ns, PodName: tt.pod}
			if got := e.PodKey(); got != tt.want {
				t.Errorf("PodKey() = %q, want %q", got, tt.want)
			}
		})
	}
}
