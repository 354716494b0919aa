package datapath

import (
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// TestBPFEnforceFlags: the endpoints entry carries which directions the
// endpoint's policy map enforces (ENDPOINT_F_ENFORCE_*), kept current
// as policies come and go, and the programs trust a clear flag: they do
// not look up the enforce entry of that direction (its per-packet cost),
// so an entry that said "not enforced" while the map enforced would let
// everything in. The agent keeps the flags a superset of the map's.
func TestBPFEnforceFlags(t *testing.T) {
	e := newE2E(t, LinuxConfig{})
	a, b := e.a, e.b
	flags := func() uint32 {
		t.Helper()
		v, ok := endpointEntry(t, e.l, b.ep.IfIndex)
		if !ok {
			t.Fatal("no endpoints entry of b")
		}
		return v.Flags & endpointFlagsEnforce
	}
	if got := flags(); got != endpointFlagEnforceKnown {
		t.Fatalf("b without policy: enforce flags %#x, want %#x", got, endpointFlagEnforceKnown)
	}
	b.ep.Policy = bOnly8080From(a.ep.Identity)
	e.realize(b)
	if got, want := flags(), uint32(endpointFlagEnforceKnown|endpointFlagEnforceIngress); got != want {
		t.Fatalf("b enforcing ingress: enforce flags %#x, want %#x", got, want)
	}
	e.mustTalk(a, b, 8080)
	e.mustNotTalk(a, b, 8081)

	// The programs read the flag: cleared by hand under an enforcing
	// map, the ingress policy is skipped (what a stale flag would do).
	v, _ := endpointEntry(t, e.l, b.ep.IfIndex)
	v.Flags &^= endpointFlagEnforceIngress
	if err := e.l.bpf.setEndpointInfo(v, b.ep.IfIndex, 0); err != nil {
		t.Fatal(err)
	}
	e.mustTalk(a, b, 8081)
	v.Flags |= endpointFlagEnforceIngress
	if err := e.l.bpf.setEndpointInfo(v, b.ep.IfIndex, 0); err != nil {
		t.Fatal(err)
	}
	e.mustNotTalk(a, b, 8081)

	b.ep.Policy = policy.NewMapState(2, true, true, nil) // deny all, both ways
	e.realize(b)
	if got := flags(); got != endpointFlagsEnforce {
		t.Fatalf("b enforcing both: enforce flags %#x, want %#x", got, endpointFlagsEnforce)
	}
	e.mustNotTalk(a, b, 8080)
	b.ep.Policy = nil
	e.realize(b)
	if got := flags(); got != endpointFlagEnforceKnown {
		t.Fatalf("b's policy removed: enforce flags %#x, want %#x", got, endpointFlagEnforceKnown)
	}
	e.mustTalk(a, b, 8081)
}
