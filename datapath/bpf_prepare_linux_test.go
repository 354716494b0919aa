package datapath

import (
	"context"
	"os"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// TestBPFPrepareThenRealize: Prepare gives the endpoint its policy maps
// (a filled slot of the outer maps) but attaches nothing and names no interface;
// the next Realize uses those maps and attaches the node's programs; a
// Prepare of a realised endpoint, or of one without an interface index,
// does nothing; Remove of a prepared endpoint leaves nothing behind.
func TestBPFPrepareThenRealize(t *testing.T) {
	l, _, nl := newTestLinux(t, LinuxConfig{TeardownDelay: -1, EndpointTCX: true})
	ctx := context.Background()
	ep := addVeth(t, nl, 31, "lxcbpfprep01", "10.244.71.2")
	ep.Identity, ep.Policy = 1500, policy.NewMapState(1, true, false, nil)

	l.Prepare(ctx, ep)
	l.bpf.mu.Lock()
	prepared := l.bpf.eps[ep.ID]
	l.bpf.mu.Unlock()
	if prepared == nil || prepared.slot == 0 || !hasOuterEntries(t, l, prepared.slot) {
		t.Fatal("Prepare opened no policy maps or wrote no outer map entries")
	}
	if _, ok := endpointEntry(t, l, ep.IfIndex); ok {
		t.Fatal("Prepare wrote the endpoints entry before Realize")
	}
	if n := tcxPrograms(t, l, ep.IfIndex); n != 0 {
		t.Fatalf("programs attached by Prepare = %d, want 0", n)
	}
	if _, err := l.Realize(ctx, ep, 1); err != nil {
		t.Fatal(err)
	}
	if l.bpf.eps[ep.ID] != prepared {
		t.Fatal("Realize opened the policy maps again instead of using the prepared ones")
	}
	if got := pinnedProgID(t, l, ep.ID); got != l.bpf.progID[0] {
		t.Fatalf("attached program %d, want the node's %d", got, l.bpf.progID[0])
	}
	if n := len(l.bpf.prep); n != 0 {
		t.Fatalf("%d prepared entries left after Realize", n)
	}
	l.Prepare(ctx, ep) // realised already: nothing to do
	if n := len(l.bpf.prep); n != 0 {
		t.Fatalf("Prepare of a realised endpoint left %d entries", n)
	}

	// Prepared, never realised, removed.
	gone := addVeth(t, nl, 33, "lxcbpfprep03", "10.244.71.4")
	l.Prepare(ctx, gone)
	goneSlot := slotOf(l, gone.ID)
	if goneSlot == 0 || !hasOuterEntries(t, l, goneSlot) {
		t.Fatal("Prepare gave the endpoint no slot")
	}
	if err := l.Remove(ctx, gone); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(l.bpf.endpointDir(gone.ID)); !os.IsNotExist(err) {
		t.Fatalf("pin directory of a prepared, removed endpoint: %v", err)
	}
	if hasOuterEntries(t, l, goneSlot) {
		t.Fatal("slot of a prepared, removed endpoint left in the outer maps")
	}
	l.bpf.mu.Lock()
	_, prep := l.bpf.prep[gone.ID]
	_, eps := l.bpf.eps[gone.ID]
	l.bpf.mu.Unlock()
	if prep || eps {
		t.Fatalf("removed endpoint still held: prepared %v, endpoint %v", prep, eps)
	}

	noIndex := &endpoint.Endpoint{ID: 34, Identity: 1500, IfName: "lxcbpfprep04"}
	l.Prepare(ctx, noIndex)
	if slotOf(l, noIndex.ID) != 0 {
		t.Fatal("Prepare of an endpoint without an interface index opened its maps")
	}
	if err := l.Remove(ctx, ep); err != nil {
		t.Fatal(err)
	}
}
