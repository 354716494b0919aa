package datapath

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/ifname"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestLinuxTeardownBound: past MaxPendingTeardowns a removal deletes the
// pair at once (and counts it); the pending one stays until it is due.
func TestLinuxTeardownBound(t *testing.T) {
	l, _, nl := newTestLinux(t, LinuxConfig{TeardownDelay: time.Hour, MaxPendingTeardowns: 1})
	ctx := context.Background()
	first := addVeth(t, nl, 21, "lxctest0000021", "10.244.48.1")
	second := addVeth(t, nl, 22, "lxctest0000022", "10.244.48.2")
	for _, ep := range []*endpoint.Endpoint{first, second} {
		if _, err := l.Realize(ctx, ep, 1); err != nil {
			t.Fatal(err)
		}
	}
	for _, ep := range []*endpoint.Endpoint{first, second} {
		if err := l.Remove(ctx, ep); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := nl.LinkByName(ifname.Tombstone(first.IfIndex)); err != nil {
		t.Fatalf("the first removal's tombstone: %v, want it pending", err)
	}
	if _, err := nl.LinkByIndex(second.IfIndex); err == nil {
		t.Fatal("the second removal's veth still exists: want it deleted at once, the queue being full")
	}
	if td := l.Teardowns(); td.Pending != 1 || td.Max != 1 || td.Sync != 1 {
		t.Fatalf("Teardowns = %+v, want 1 pending of 1, 1 deleted at once", td)
	}
}

// TestLinuxTombstoneSweep: a tombstone no teardown is pending for (an
// agent killed between a removal and its deletion) is deleted after the
// next start's Init, and one that appears later by the next GC pass.
func TestLinuxTombstoneSweep(t *testing.T) {
	testutil.RequireRoot(t)
	host := testutil.NewNS(t, "mbt-tomb")
	nl := host.Netlink(t)
	tombstone := func(name string) int {
		t.Helper()
		ep := addVeth(t, nl, 0, name, "10.244.49.1")
		link, err := nl.LinkByIndex(ep.IfIndex)
		if err != nil {
			t.Fatal(err)
		}
		if err := nl.LinkSetDown(link); err != nil {
			t.Fatal(err)
		}
		if err := nl.LinkSetName(link, ifname.Tombstone(ep.IfIndex)); err != nil {
			t.Fatal(err)
		}
		return ep.IfIndex
	}
	gone := func(index int) func() bool {
		return func() bool { _, err := nl.LinkByIndex(index); return err != nil }
	}
	before := tombstone("lxctest0000031")
	keep := addVeth(t, nl, 0, "lxctest0000033", "10.244.49.3") // not a tombstone: GC's two passes
	// Another program's veth named like a tombstone, not after its own
	// index: never the agent's to delete.
	foreign := addVeth(t, nl, 0, "lxctest0000034", "10.244.49.4")
	if link, err := nl.LinkByIndex(foreign.IfIndex); err != nil {
		t.Fatal(err)
	} else if err := nl.LinkSetName(link, ifname.Tombstone(foreign.IfIndex+1)); err != nil {
		t.Fatal(err)
	}
	cfg := LinuxConfig{HostNetns: host.Path, BPFFS: testutil.BPFFSDir(t), TeardownDelay: 10 * time.Millisecond}
	l, err := NewLinux(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	if err := l.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "Init's sweep to delete the tombstone", gone(before))
	after := tombstone("lxctest0000032")
	r, err := l.GC(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Tombstones != 1 {
		t.Fatalf("GC report %+v, want 1 tombstone", r)
	}
	testutil.Eventually(t, "GC's sweep to delete the tombstone", gone(after))
	if _, err := nl.LinkByIndex(keep.IfIndex); err != nil {
		t.Fatalf("a first-seen orphan veth was deleted by one pass: %v", err)
	}
	for range 2 { // two passes: not a managed name either, so never
		if _, err := l.GC(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := nl.LinkByIndex(foreign.IfIndex); err != nil {
		t.Fatalf("a veth named like a tombstone but not after its own index was deleted: %v", err)
	}
}
