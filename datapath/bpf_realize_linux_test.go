package datapath

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// tcxPrograms lists the TCX programs attached to ifindex in the host
// netns (BPF_PROG_QUERY runs in the caller's netns).
func tcxPrograms(t *testing.T, l *Linux, ifindex int) int {
	t.Helper()
	n := 0
	for _, h := range hooks {
		var res *link.QueryResult
		if err := l.inHost(func() error {
			var err error
			res, err = link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: h.tcx})
			return err
		}); err != nil {
			t.Fatalf("query tcx programs: %v", err)
		}
		n += len(res.Programs)
	}
	return n
}

// attachedCount counts the endpoint programs on ifindex: TCX programs,
// or Membrane's cls_bpf filters.
func attachedCount(t *testing.T, l *Linux, ifindex int, tcx bool) int {
	t.Helper()
	if tcx {
		return tcxPrograms(t, l, ifindex)
	}
	n := 0
	lk, err := l.nl.LinkByIndex(ifindex)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hooks {
		if _, ok := legacyProgram(l.nl, lk, h); ok {
			n++
		}
	}
	return n
}

func TestBPFRealizeMovesToNewInterface(t *testing.T) {
	for _, tcx := range []bool{true, false} {
		t.Run(map[bool]string{false: "tc", true: "tcx"}[tcx], func(t *testing.T) { testMovesToNewInterface(t, tcx) })
	}
}

func testMovesToNewInterface(t *testing.T, tcx bool) {
	l, _, nl := newTestLinux(t, LinuxConfig{TeardownDelay: -1, EndpointTCX: tcx})
	ctx := context.Background()
	ep := addVeth(t, nl, 21, "lxcbpfmove01", "10.244.70.2")
	ep.Identity, ep.Policy = 1500, policy.NewMapState(1, true, false, nil)
	if _, err := l.Realize(ctx, ep, 1); err != nil {
		t.Fatal(err)
	}
	if n := attachedCount(t, l, ep.IfIndex, tcx); n != 2 {
		t.Fatalf("programs on the first interface = %d, want 2", n)
	}
	old := ep.IfIndex
	moved := addVeth(t, nl, 21, "lxcbpfmove02", "10.244.70.2")
	moved.Identity, moved.Policy = ep.Identity, ep.Policy
	if _, err := l.Realize(ctx, moved, 2); err != nil {
		t.Fatal(err)
	}
	if n := attachedCount(t, l, moved.IfIndex, tcx); n != 2 {
		t.Fatalf("programs on the new interface = %d, want 2", n)
	}
	if n := attachedCount(t, l, old, tcx); n != 0 {
		t.Fatalf("programs left on the old interface = %d, want 0", n)
	}
	if _, ok := endpointEntry(t, l, old); ok {
		t.Fatal("endpoints entry of the old interface left")
	}
	if v, ok := endpointEntry(t, l, moved.IfIndex); !ok || v.Id != 21 {
		t.Fatalf("endpoints entry of the new interface = %+v, %v", v, ok)
	}
	if err := l.Remove(ctx, moved); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(l.bpf.endpointDir(21)); !os.IsNotExist(err) {
		t.Fatalf("endpoint pin directory after Remove: %v", err)
	}
	if _, err := os.Stat(filepath.Join(l.cfg.BPFFS, pinIPCache)); err != nil {
		t.Fatalf("shared ipcache pin: %v", err)
	}
}

func TestBPFRemoveDetachesInBackground(t *testing.T) {
	l, _, nl := newTestLinux(t, LinuxConfig{TeardownDelay: time.Hour, EndpointTCX: true})
	ctx := context.Background()
	ep := addVeth(t, nl, 22, "lxcbpfremove1", "10.244.70.3")
	if _, err := l.Realize(ctx, ep, 1); err != nil {
		t.Fatal(err)
	}
	if err := l.Remove(ctx, ep); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the programs to be detached", func() bool { return tcxPrograms(t, l, ep.IfIndex) == 0 })
	if _, err := nl.LinkByIndex(ep.IfIndex); err != nil {
		t.Fatalf("host veth gone before its teardown delay: %v", err)
	}
}

// TestBPFRealizeRefusesOversizedPolicy: a policy with more entries than
// the policy map holds is refused with ErrMapFull and fails closed (the
// endpoint enforces deny-all both ways, not its previous policy); one
// that fills the map exactly is realised.
func TestBPFRealizeRefusesOversizedPolicy(t *testing.T) {
	l, _, nl := newTestLinux(t, LinuxConfig{TeardownDelay: -1})
	ep := addVeth(t, nl, 23, "lxcbpfbig0001", "10.244.70.4")
	keys := make([]policy.Key, 16383)
	for i := range keys {
		keys[i] = policy.Key{Identity: identity.NumericIdentity(256 + i), Dir: policy.Ingress}
	}
	ep.Policy = policy.NewMapState(1, true, false, keys[:10])
	if _, err := l.Realize(context.Background(), ep, 1); err != nil {
		t.Fatal(err)
	}
	ep.Policy = policy.NewMapState(2, true, false, keys)
	if _, err := l.Realize(context.Background(), ep, 2); !errors.Is(err, ErrMapFull) {
		t.Fatalf("Realize of a 16383-entry policy = %v, want ErrMapFull", err)
	}
	if entries, ingress, egress, err := l.DumpPolicy(context.Background(), ep.ID); err != nil || !ingress || !egress || len(entries) != 0 {
		t.Fatalf("policy map after the refusal: %d entries, ingress %v, egress %v (%v); want deny-all", len(entries), ingress, egress, err)
	}
	ep.Policy = policy.NewMapState(3, true, false, keys[:16382])
	if _, err := l.Realize(context.Background(), ep, 3); err != nil {
		t.Fatalf("Realize of a full policy map: %v", err)
	}
	entries, ingress, egress, err := l.DumpPolicy(context.Background(), ep.ID)
	if err != nil || !ingress || egress || len(entries) != 16382 {
		t.Fatalf("DumpPolicy = %d entries, %v, %v", len(entries), ingress, err)
	}
}

// reopen closes l and starts a new Linux datapath on its configuration
// (an agent restart).
func reopen(t *testing.T, l *Linux) *Linux {
	t.Helper()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2, err := NewLinux(l.cfg, l.log)
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l2.Close() })
	return l2
}

func pinnedProgID(t *testing.T, l *Linux, id endpoint.ID) ebpf.ProgramID {
	t.Helper()
	return pinnedLinkInfo(t, l, id).Program
}

// pinnedLinkInfo is the endpoint's pinned from-container TCX link's info.
func pinnedLinkInfo(t *testing.T, l *Linux, id endpoint.ID) *link.Info {
	t.Helper()
	lk, err := link.LoadPinnedLink(filepath.Join(l.bpf.endpointDir(id), pinLinkFrom), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	info, err := lk.Info()
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// TestBPFAdoptOnlyCurrentPrograms: after a restart of the same build the
// node's pinned programs are reused and the endpoints' attachments
// adopted (a new identity is only a map write); after a restart with a
// changed object the programs are loaded again and each endpoint's
// attachment is replaced in place (the same TCX link, or the same
// cls_bpf filter, now running the new program).
func TestBPFAdoptOnlyCurrentPrograms(t *testing.T) {
	for _, tcx := range []bool{true, false} {
		name := "tc"
		if tcx {
			name = "tcx"
		}
		t.Run(name, func(t *testing.T) { testAdoptOnlyCurrent(t, tcx) })
	}
}

func testAdoptOnlyCurrent(t *testing.T, tcx bool) {
	l, _, nl := newTestLinux(t, LinuxConfig{TeardownDelay: -1, EndpointTCX: tcx})
	ctx := context.Background()
	ep := addVeth(t, nl, 24, "lxcbpfadopt01", "10.244.70.5")
	ep.Identity = 1500
	if _, err := l.Realize(ctx, ep, 1); err != nil {
		t.Fatal(err)
	}
	first := l.bpf.progID
	if got, gotTCX, _ := l.attachedIDs(l.bpf.endpointDir(ep.ID), ep.IfIndex); got != first || gotTCX != tcx {
		t.Fatalf("attached %v (tcx %v), want the node's %v (tcx %v)", got, gotTCX, first, tcx)
	}
	linkBefore := pinnedLinkID(t, l, ep.ID, tcx)
	firstSlot := slotOf(l, ep.ID)
	if !tcx && linkBefore != 11 {
		t.Fatalf("cls_bpf filters per hook = %d, want one each (11)", linkBefore)
	}

	l = reopen(t, l)
	if l.bpf.progID != first {
		t.Fatalf("same build after restart: node programs %v reloaded as %v", first, l.bpf.progID)
	}
	var attaches int
	l.SetHooks(LinuxHooks{Phase: func(p string, _ time.Duration) {
		if p == PhaseBPFAttach {
			attaches++
		}
	}})
	ep.Identity = 1600
	if _, err := l.Realize(ctx, ep, 2); err != nil {
		t.Fatal(err)
	}
	if attaches != 0 {
		t.Fatal("same build after restart: the endpoint was attached again instead of adopted")
	}
	if got := slotOf(l, ep.ID); got != firstSlot {
		t.Fatalf("slot after restart = %d, want the endpoint's %d", got, firstSlot)
	}
	if v, ok := endpointEntry(t, l, ep.IfIndex); !ok || v.Id != uint32(ep.ID) || v.Identity != 1600 {
		t.Fatalf("endpoints entry after an identity change = %+v, %v", v, ok)
	}

	objectDigest = func() string { return "changed-object" }
	t.Cleanup(func() { objectDigest = bpf.EndpointObjectDigest })
	l = reopen(t, l)
	if l.bpf.progID == first {
		t.Fatal("changed object after restart: the old programs were kept")
	}
	if ents, err := os.ReadDir(filepath.Join(l.cfg.BPFFS, pinProgramsDir)); err != nil || len(ents) != 1 || ents[0].Name() != "changed-object" {
		t.Fatalf("program pin directories after an upgrade = %v, %v; want only the new object's", ents, err)
	}
	if _, err := l.Realize(ctx, ep, 3); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := l.attachedIDs(l.bpf.endpointDir(ep.ID), ep.IfIndex); got != l.bpf.progID {
		t.Fatalf("changed object: attached %v, want the new programs %v", got, l.bpf.progID)
	}
	if after := pinnedLinkID(t, l, ep.ID, tcx); after != linkBefore {
		t.Fatalf("changed object: attachment %d replaced by %d, want it updated in place", linkBefore, after)
	}
}

// pinnedLinkID identifies the endpoint's from-container attachment: its
// TCX link's ID or (cls_bpf) the number of filters on each hook, which
// a replace in place keeps at one.
func pinnedLinkID(t *testing.T, l *Linux, id endpoint.ID, tcx bool) uint32 {
	t.Helper()
	if !tcx {
		var n uint32
		for _, h := range hooks {
			filters, err := l.nl.FilterList(&netlink.GenericLink{LinkAttrs: netlink.LinkAttrs{Index: l.bpf.eps[id].ifindex}}, h.parent)
			if err != nil {
				t.Fatal(err)
			}
			n = n*10 + uint32(len(filters))
		}
		return n
	}
	return uint32(pinnedLinkInfo(t, l, id).ID)
}

// TestBPFAttachModeSticksAcrossRestart: an endpoint keeps the attach mode
// it was first attached with when the agent restarts in another mode
// (no second program on its veth); new endpoints get the new mode.
func TestBPFAttachModeSticksAcrossRestart(t *testing.T) {
	l, _, nl := newTestLinux(t, LinuxConfig{TeardownDelay: -1, EndpointTCX: true})
	ctx := context.Background()
	ep := addVeth(t, nl, 25, "lxcbpfmode01", "10.244.70.6")
	ep.Identity = 1500
	if _, err := l.Realize(ctx, ep, 1); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	cfg := l.cfg
	cfg.EndpointTCX = false // the default: cls_bpf for endpoints
	l, err := NewLinux(cfg, l.log)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Init(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	if _, err := l.Realize(ctx, ep, 2); err != nil {
		t.Fatal(err)
	}
	if ids, tcx, _ := l.attachedIDs(l.bpf.endpointDir(ep.ID), ep.IfIndex); !tcx || ids != l.bpf.progID {
		t.Fatalf("restarted in cls_bpf mode: endpoint runs %v (tcx %v), want the node's %v on its TCX links", ids, tcx, l.bpf.progID)
	}
	if n := attachedCount(t, l, ep.IfIndex, false); n != 0 {
		t.Fatalf("%d cls_bpf filters added next to the TCX links", n)
	}
	fresh := addVeth(t, nl, 26, "lxcbpfmode02", "10.244.70.7")
	if _, err := l.Realize(ctx, fresh, 1); err != nil {
		t.Fatal(err)
	}
	if n := attachedCount(t, l, fresh.IfIndex, false); n != 2 {
		t.Fatalf("new endpoint: %d cls_bpf filters, want 2", n)
	}
	if n := tcxPrograms(t, l, fresh.IfIndex); n != 0 {
		t.Fatalf("new endpoint: %d TCX programs, want 0", n)
	}
}
