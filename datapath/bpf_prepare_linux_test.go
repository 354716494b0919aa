package datapath

import (
	"context"
	"os"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// preparedID is the ID of the from-container program a Prepare of id
// loaded (0: none waiting).
func preparedID(t *testing.T, l *Linux, id endpoint.ID) ebpf.ProgramID {
	t.Helper()
	l.bpf.mu.Lock()
	p := l.bpf.prep[id]
	l.bpf.mu.Unlock()
	if p == nil || p == claimed {
		return 0
	}
	<-p.done
	if p.progs.from == nil {
		return 0
	}
	info, err := p.progs.from.Info()
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := info.ID()
	return pid
}

// TestBPFPrepareThenRealize: the programs Prepare loads are the ones the
// next Realize attaches, for the same identity only; a Prepare after the
// programs run, or of an endpoint without an interface index, does
// nothing; Remove of a prepared endpoint leaves nothing behind.
func TestBPFPrepareThenRealize(t *testing.T) {
	l, _, nl := newTestLinux(t, LinuxConfig{TeardownDelay: -1})
	ctx := context.Background()
	ep := addVeth(t, nl, 31, "lxcbpfprep01", "10.244.71.2")
	ep.Identity, ep.Policy = 1500, policy.NewMapState(1, true, false, nil)

	l.Prepare(ctx, ep)
	want := preparedID(t, l, ep.ID)
	if want == 0 {
		t.Fatal("Prepare loaded no programs")
	}
	if n := tcxPrograms(t, l, ep.IfIndex); n != 0 {
		t.Fatalf("programs attached by Prepare = %d, want 0", n)
	}
	if _, err := l.Realize(ctx, ep, 1); err != nil {
		t.Fatal(err)
	}
	if got := pinnedProgID(t, l, ep.ID); got != want {
		t.Fatalf("attached program %d, want the prepared %d", got, want)
	}
	if n := len(l.bpf.prep); n != 0 {
		t.Fatalf("%d prepared entries left after Realize", n)
	}
	l.Prepare(ctx, ep) // programs run already: nothing to do
	if n := len(l.bpf.prep); n != 0 {
		t.Fatalf("Prepare of a realised endpoint left %d entries", n)
	}

	// Prepared for another identity than the one realised: reloaded.
	other := addVeth(t, nl, 32, "lxcbpfprep02", "10.244.71.3")
	other.Identity = 1500
	l.Prepare(ctx, other)
	stale := preparedID(t, l, other.ID)
	other.Identity = 1600
	if _, err := l.Realize(ctx, other, 1); err != nil {
		t.Fatal(err)
	}
	if got := pinnedProgID(t, l, other.ID); got == stale || got == 0 {
		t.Fatalf("attached program %d, want a new one (prepared %d for another identity)", got, stale)
	}

	// Prepared, never realised, removed.
	gone := addVeth(t, nl, 33, "lxcbpfprep03", "10.244.71.4")
	l.Prepare(ctx, gone)
	if preparedID(t, l, gone.ID) == 0 {
		t.Fatal("Prepare loaded no programs")
	}
	if err := l.Remove(ctx, gone); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(l.bpf.endpointDir(gone.ID)); !os.IsNotExist(err) {
		t.Fatalf("pin directory of a prepared, removed endpoint: %v", err)
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
	if preparedID(t, l, noIndex.ID) != 0 {
		t.Fatal("Prepare of an endpoint without an interface index loaded programs")
	}
	for _, e := range []*endpoint.Endpoint{ep, other} {
		if err := l.Remove(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
}
