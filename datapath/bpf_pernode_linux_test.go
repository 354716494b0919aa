package datapath

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// slotOf is endpoint id's slot (0: not open).
func slotOf(l *Linux, id endpoint.ID) uint32 {
	l.bpf.mu.Lock()
	defer l.bpf.mu.Unlock()
	if e := l.bpf.eps[id]; e != nil {
		return e.slot
	}
	return 0
}

// hasOuterEntries reports whether both outer maps hold slot n (failing
// the test if they disagree).
func hasOuterEntries(t *testing.T, l *Linux, n uint32) bool {
	t.Helper()
	var k int
	for _, m := range []*ebpf.Map{l.bpf.maps.policyMaps, l.bpf.maps.cidrMaps} {
		var inner ebpf.MapID
		err := m.Lookup(n, &inner)
		switch {
		case err == nil:
			k++
		case !errors.Is(err, ebpf.ErrKeyNotExist):
			t.Fatalf("outer map lookup: %v", err)
		}
	}
	if k == 1 {
		t.Fatalf("slot %d is in one outer map only", n)
	}
	return k == 2
}

// endpointEntry returns the endpoints map entry of ifindex.
func endpointEntry(t *testing.T, l *Linux, ifindex int) (bpf.EndpointEndpointInfo, bool) {
	t.Helper()
	var v bpf.EndpointEndpointInfo
	err := l.bpf.maps.endpoints.Lookup(uint32(ifindex), &v)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return v, false
	}
	if err != nil {
		t.Fatalf("endpoints lookup: %v", err)
	}
	return v, true
}

// attachedNode checks that p's interface runs the node's programs.
func (e *e2eEnv) attachedNode(p *testPod) {
	e.t.Helper()
	ids, _, found := e.l.attachedIDs(e.l.bpf.endpointDir(p.ep.ID), p.ep.IfIndex)
	if !found || ids != e.l.bpf.progID {
		e.t.Fatalf("endpoint %d runs %v, want the node's programs %v", p.ep.ID, ids, e.l.bpf.progID)
	}
}

// TestBPFSharedProgramsOwnPolicies: the three endpoints run the same two
// programs, and each enforces its own policy, counts its own drops and
// reports its own identity: the endpoint comes from the endpoints map.
func TestBPFSharedProgramsOwnPolicies(t *testing.T) {
	for _, tcx := range []bool{false, true} {
		t.Run(map[bool]string{false: "tc", true: "tcx"}[tcx], func(t *testing.T) {
			e := newE2E(t, LinuxConfig{EndpointTCX: tcx})
			a, b, c := e.a, e.b, e.c
			for _, p := range []*testPod{a, b, c} {
				e.attachedNode(p)
			}
			b.ep.Policy = bOnly8080From(a.ep.Identity) // b: only a, port 8080
			e.realize(b)
			a.ep.Policy = policy.NewMapState(2, true, false, []policy.Key{ // a: only c
				{Identity: c.ep.Identity, Port: 8080, Proto: policy.ProtoTCP, Dir: policy.Ingress}})
			e.realize(a)

			e.mustTalk(a, b, 8080)
			e.mustNotTalk(c, b, 8080)
			e.mustNotTalk(a, b, 8081)
			e.mustTalk(c, a, 8080)
			e.mustNotTalk(b, a, 8080)
			e.waitDrop(DropEvent{Endpoint: b.ep.ID, Reason: DropPolicy, Dir: policy.Ingress,
				Src: c.addr(), Dst: b.addr(), DstPort: 8080, Proto: 6, TCPFlags: tcpSYN, PeerIdentity: c.ep.Identity})
			e.waitDrop(DropEvent{Endpoint: a.ep.ID, Reason: DropPolicy, Dir: policy.Ingress,
				Src: b.addr(), Dst: a.addr(), DstPort: 8080, Proto: 6, TCPFlags: tcpSYN, PeerIdentity: b.ep.Identity})
			if e.dropCount(c.ep.ID, DropPolicy, policy.Ingress) != 0 {
				t.Fatal("drops counted under endpoint c, which enforces nothing")
			}
			if e.dropCount(0, DropNoEndpoint, policy.Ingress)+e.dropCount(0, DropNoEndpoint, policy.Egress) != 0 {
				t.Fatal("no-endpoint drops on realised endpoints")
			}
		})
	}
}

// TestBPFInterfaceWithoutEndpointDrops: a packet on an interface running
// the endpoint programs without an endpoints entry is dropped (fail
// closed), counted and reported under endpoint 0 as no-endpoint; the
// entry back, traffic passes again.
func TestBPFInterfaceWithoutEndpointDrops(t *testing.T) {
	e := newE2E(t, LinuxConfig{})
	a, b := e.a, e.b
	e.mustTalk(a, b, 8080)
	if err := e.l.bpf.maps.endpoints.Delete(uint32(b.ep.IfIndex)); err != nil {
		t.Fatal(err)
	}
	e.mustNotTalk(a, b, 8080)
	e.waitDrop(DropEvent{Endpoint: 0, Reason: DropNoEndpoint, Dir: policy.Ingress,
		Src: a.addr(), Dst: b.addr(), DstPort: 8080, Proto: 6, TCPFlags: tcpSYN})
	if e.dropCount(0, DropNoEndpoint, policy.Ingress) == 0 {
		t.Fatal("no no-endpoint drop counted under endpoint 0")
	}
	if err := e.l.bpf.setEndpointInfo(endpointInfo(b.ep.ID, b.ep.Identity, slotOf(e.l, b.ep.ID), addrsOf(b.ep)), b.ep.IfIndex, 0); err != nil {
		t.Fatal(err)
	}
	e.mustTalk(a, b, 8080)
}

// TestBPFRemoveDeletesEntries: Remove deletes the endpoint's endpoints
// entry and empties its slot from the outer maps (in the worker pool;
// at once here, TeardownDelay < 0), and only its own.
func TestBPFRemoveDeletesEntries(t *testing.T) {
	for _, tcx := range []bool{false, true} {
		t.Run(map[bool]string{false: "tc", true: "tcx"}[tcx], func(t *testing.T) {
			e := newE2E(t, LinuxConfig{EndpointTCX: tcx})
			a, b := e.a, e.b
			bSlot := slotOf(e.l, b.ep.ID)
			if v, ok := endpointEntry(t, e.l, b.ep.IfIndex); !ok || v.Id != uint32(b.ep.ID) || v.Identity != uint32(b.ep.Identity) || v.Slot != bSlot {
				t.Fatalf("endpoints entry of b = %+v, %v; want slot %d", v, ok, bSlot)
			}
			if bSlot == 0 || !hasOuterEntries(t, e.l, bSlot) {
				t.Fatal("no outer map entries for b")
			}
			if err := e.l.Remove(context.Background(), b.ep); err != nil {
				t.Fatal(err)
			}
			if _, ok := endpointEntry(t, e.l, b.ep.IfIndex); ok {
				t.Fatal("endpoints entry left after Remove")
			}
			if hasOuterEntries(t, e.l, bSlot) {
				t.Fatal("outer map entries left after Remove")
			}
			if _, ok := endpointEntry(t, e.l, a.ep.IfIndex); !ok || !hasOuterEntries(t, e.l, slotOf(e.l, a.ep.ID)) {
				t.Fatal("Remove of b deleted a's entries")
			}
			e.mustTalk(e.c, a, 8080)
		})
	}
}

// TestBPFReloadOnRestartKeepsTraffic: an agent restart with a changed
// object loads the programs again and replaces each endpoint's
// attachment in place; an established connection keeps working across
// the swap, the programs drop nothing meanwhile, and the policies still
// hold afterwards.
func TestBPFReloadOnRestartKeepsTraffic(t *testing.T) {
	for _, tcx := range []bool{false, true} {
		t.Run(map[bool]string{false: "tc", true: "tcx"}[tcx], func(t *testing.T) { testReloadKeepsTraffic(t, tcx) })
	}
}

func testReloadKeepsTraffic(t *testing.T, tcx bool) {
	e := newE2E(t, LinuxConfig{EndpointTCX: tcx})
	a, b := e.a, e.b
	b.ep.Policy = bOnly8080From(a.ep.Identity)
	e.realize(b)
	old := e.l.bpf.progID
	var conn net.Conn
	if err := a.ns.Do(func() error {
		var err error
		conn, err = net.DialTimeout("tcp", net.JoinHostPort(b.addr().String(), "8080"), connectTimeout)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	echo := func(msg string) error {
		_ = conn.SetDeadline(time.Now().Add(connectTimeout))
		if _, err := conn.Write([]byte(msg)); err != nil {
			return err
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(conn, got); err != nil {
			return err
		}
		if string(got) != msg {
			return fmt.Errorf("echo %q, want %q", got, msg)
		}
		return nil
	}
	if err := echo("before"); err != nil {
		t.Fatal(err)
	}
	// Traffic on the connection all through the restart.
	stop := make(chan struct{})
	echoed := make(chan error, 1)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				echoed <- nil
				return
			default:
			}
			if err := echo(fmt.Sprintf("during-%06d", n)); err != nil {
				echoed <- err
				return
			}
			n++
		}
	}()
	objectDigest = func() string { return "changed-object" }
	t.Cleanup(func() { objectDigest = bpf.EndpointObjectDigest })
	l2 := reopen(t, e.l)
	e.l = l2
	if l2.bpf.progID == old {
		t.Fatal("changed object: programs not reloaded")
	}
	for _, p := range []*testPod{e.a, b, e.c} {
		e.realize(p)
		e.attachedNode(p)
	}
	close(stop)
	if err := <-echoed; err != nil {
		t.Fatalf("established connection across the reload: %v", err)
	}
	if err := echo("after"); err != nil {
		t.Fatal(err)
	}
	for _, k := range []DropKey{{Endpoint: b.ep.ID, Reason: DropPolicy, Dir: policy.Ingress},
		{Endpoint: 0, Reason: DropNoEndpoint, Dir: policy.Ingress}, {Endpoint: 0, Reason: DropNoEndpoint, Dir: policy.Egress}} {
		if n := e.dropCount(k.Endpoint, k.Reason, k.Dir); n != 0 {
			t.Fatalf("%d drops %+v during the reload, want none", n, k)
		}
	}
	e.mustTalk(a, b, 8080)
	e.mustNotTalk(e.c, b, 8080)
}

// outerMapIDs returns the inner map IDs policy_maps holds.
func outerMapIDs(t *testing.T, l *Linux) map[ebpf.MapID]bool {
	t.Helper()
	ids := map[ebpf.MapID]bool{}
	var k uint32
	var inner ebpf.MapID
	it := l.bpf.maps.policyMaps.Iterate()
	for it.Next(&k, &inner) {
		ids[inner] = true
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// spareIDs waits for no filler to run (the spares are refilled once no
// more than refillAt are left) and returns their policy maps' IDs.
func spareIDs(t *testing.T, l *Linux) []ebpf.MapID {
	t.Helper()
	p := &l.bpf.slots
	testutil.Eventually(t, "the spare slots to be filled", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.spare) > refillAt && !p.filling
	})
	p.mu.Lock()
	defer p.mu.Unlock()
	var ids []ebpf.MapID
	for _, s := range p.spare {
		info, err := s.pm.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		ids = append(ids, id)
	}
	return ids
}

// TestBPFSlotsAcrossRestart: a new endpoint takes a filled slot; a restarted agent keeps the endpoint's slot and
// empties the previous agent's spares from the outer maps.
func TestBPFSlotsAcrossRestart(t *testing.T) {
	l, _, nl := newTestLinux(t, LinuxConfig{TeardownDelay: -1})
	ctx := context.Background()
	before := spareIDs(t, l)
	ep := addVeth(t, nl, 41, "lxcbpfslot01", "10.244.72.2")
	ep.Identity, ep.Policy = 1500, policy.NewMapState(1, true, false, nil)
	if _, err := l.Realize(ctx, ep, 1); err != nil {
		t.Fatal(err)
	}
	info, err := l.bpf.eps[ep.ID].policyMap.Info()
	if err != nil {
		t.Fatal(err)
	}
	epMap, _ := info.ID()
	if !slices.Contains(before, epMap) {
		t.Fatalf("the endpoint's policy map %d is not one of the spares %v", epMap, before)
	}
	epSlot := slotOf(l, ep.ID)
	old := spareIDs(t, l)
	if slices.Contains(old, epMap) {
		t.Fatal("the endpoint's slot is still a spare")
	}
	l = reopen(t, l)
	if _, err := l.Realize(ctx, ep, 2); err != nil {
		t.Fatal(err)
	}
	if got := slotOf(l, ep.ID); got != epSlot {
		t.Fatalf("slot after restart = %d, want %d", got, epSlot)
	}
	testutil.Eventually(t, "the previous agent's spares to leave the outer maps", func() bool {
		ids := outerMapIDs(t, l)
		for _, id := range old {
			if ids[id] {
				return false
			}
		}
		return ids[epMap]
	})
}

// TestBPFSlotsRefill: taking spares down to refillAt refills all of them
// (one batch per outer map), and the slots written are in the outer maps.
func TestBPFSlotsRefill(t *testing.T) {
	l, _, _ := newTestLinux(t, LinuxConfig{TeardownDelay: -1})
	b, p := l.bpf, &l.bpf.slots
	spareIDs(t, l)
	taken := takeSlots(t, b, spareSlots-refillAt)
	testutil.Eventually(t, "the spares to be refilled", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.spare) == spareSlots && !p.filling
	})
	ids := outerMapIDs(t, l)
	p.mu.Lock()
	spares := slices.Clone(p.spare)
	p.mu.Unlock()
	for _, s := range append(spares, taken...) {
		if !slotHolds(b.maps.policyMaps, s.n, s.pm) || !slotHolds(b.maps.cidrMaps, s.n, s.cm) {
			t.Fatalf("slot %d does not hold its maps", s.n)
		}
	}
	if len(ids) < spareSlots+len(taken) {
		t.Fatalf("outer policy map holds %d maps, want at least %d", len(ids), spareSlots+len(taken))
	}
}

// TestBPFSlotsReleaseBatched: slots released at once (a burst of DELs)
// all leave both outer maps and their numbers are freed; a release of a
// slot that is not in the outer maps succeeds, and a missing key in the
// middle of a batch does not stop the keys after it.
func TestBPFSlotsReleaseBatched(t *testing.T) {
	l, _, _ := newTestLinux(t, LinuxConfig{TeardownDelay: -1})
	b, p := l.bpf, &l.bpf.slots
	spareIDs(t, l)
	const n = 20
	var taken []slot
	for range n {
		s, err := b.takeSlot()
		if err != nil {
			t.Fatal(err)
		}
		taken = append(taken, s)
	}
	t.Cleanup(func() {
		for _, s := range taken {
			s.close()
		}
	})
	missing, err := b.allocSlot() // reserved, never written
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, n+1)
	for _, k := range append([]uint32{missing}, slotNumbers(taken)...) {
		go func() { errs <- b.releaseSlot(k) }()
	}
	for range n + 1 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	for _, s := range taken {
		for _, outer := range []*ebpf.Map{b.maps.policyMaps, b.maps.cidrMaps} {
			var id ebpf.MapID
			if err := outer.Lookup(s.n, &id); !errors.Is(err, ebpf.ErrKeyNotExist) {
				t.Errorf("slot %d still in an outer map (lookup: %v)", s.n, err)
			}
		}
	}
	p.mu.Lock()
	for _, k := range append([]uint32{missing}, slotNumbers(taken)...) {
		if p.used[k] {
			t.Errorf("slot number %d not freed", k)
		}
	}
	p.mu.Unlock()

	// A batch with a missing key between two present ones.
	var pair []slot
	for range 2 {
		s, err := b.newSlot()
		if err != nil {
			t.Fatal(err)
		}
		pair = append(pair, s)
		t.Cleanup(s.close)
	}
	keys := []uint32{pair[0].n, missing, pair[1].n}
	kerrs := make([]error, len(keys))
	for _, outer := range []*ebpf.Map{b.maps.policyMaps, b.maps.cidrMaps} {
		deleteOuterKeys(outer, keys, kerrs)
		for _, s := range pair {
			var id ebpf.MapID
			if err := outer.Lookup(s.n, &id); !errors.Is(err, ebpf.ErrKeyNotExist) {
				t.Errorf("slot %d still in an outer map after the batch (lookup: %v)", s.n, err)
			}
		}
	}
	if err := errors.Join(kerrs...); err != nil {
		t.Errorf("batch with a missing key: %v", err)
	}
	for _, s := range pair {
		b.freeSlot(s.n)
	}
}

func slotNumbers(ss []slot) []uint32 {
	ns := make([]uint32, len(ss))
	for i, s := range ss {
		ns[i] = s.n
	}
	return ns
}

// TestBPFSlotsInconsistentReleasedAtRestart: a restarted agent that finds
// an endpoint's slot holding other maps than the endpoint's pinned ones
// writes them to a new slot and empties the old one once the endpoints
// entry names the new slot (before, it stayed until the next restart).
func TestBPFSlotsInconsistentReleasedAtRestart(t *testing.T) {
	l, _, nl := newTestLinux(t, LinuxConfig{TeardownDelay: -1})
	ctx := context.Background()
	ep := addVeth(t, nl, 42, "lxcbpfslot02", "10.244.72.3")
	ep.Identity, ep.Policy = 1501, policy.NewMapState(1, true, false, nil)
	if _, err := l.Realize(ctx, ep, 1); err != nil {
		t.Fatal(err)
	}
	old := slotOf(l, ep.ID)
	// The slot now holds maps of nobody's (a crash between writing a slot
	// and the endpoints entry leaves such a state).
	for _, c := range []struct {
		outer *ebpf.Map
		spec  *ebpf.MapSpec
	}{{l.bpf.maps.policyMaps, l.bpf.tmpl.policySpec()}, {l.bpf.maps.cidrMaps, l.bpf.tmpl.cidrSpec()}} {
		m, err := ebpf.NewMap(c.spec)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.outer.Update(old, m, ebpf.UpdateExist); err != nil {
			t.Fatal(err)
		}
		m.Close()
	}
	l = reopen(t, l)
	if _, err := l.Realize(ctx, ep, 2); err != nil {
		t.Fatal(err)
	}
	got := slotOf(l, ep.ID)
	if got == old || got == 0 {
		t.Fatalf("slot after restart = %d, want a new one (old %d)", got, old)
	}
	if v, ok := endpointEntry(t, l, ep.IfIndex); !ok || v.Slot != got {
		t.Fatalf("endpoints entry %+v (%v), want slot %d", v, ok, got)
	}
	if !hasOuterEntries(t, l, got) {
		t.Fatalf("new slot %d not in the outer maps", got)
	}
	if hasOuterEntries(t, l, old) {
		t.Fatalf("inconsistent slot %d still in the outer maps", old)
	}
	l.bpf.slots.mu.Lock()
	inUse := l.bpf.slots.used[old]
	l.bpf.slots.mu.Unlock()
	if inUse {
		t.Fatalf("slot %d still marked in use", old)
	}
}

// TestBPFSlotsFillStopsAboveRefillAt: a filler that finds more than
// refillAt spares (slots were taken while its batch was written, but
// not enough to need another) writes no batch for the few missing: each
// batch waits two grace periods whatever its size.
func TestBPFSlotsFillStopsAboveRefillAt(t *testing.T) {
	l, _, _ := newTestLinux(t, LinuxConfig{TeardownDelay: -1})
	b, p := l.bpf, &l.bpf.slots
	spareIDs(t, l)
	takeSlots(t, b, spareSlots-refillAt-1) // refillAt+1 left: no refill starts
	p.mu.Lock()
	left, filling := len(p.spare), p.filling
	p.filling = true // as a filler whose batch just ended
	p.mu.Unlock()
	if left != refillAt+1 || filling {
		t.Fatalf("%d spares (filling %v), want %d and no filler", left, filling, refillAt+1)
	}
	p.wg.Add(1)
	b.fill()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.spare) != refillAt+1 || p.filling {
		t.Fatalf("after fill: %d spares (filling %v), want %d spares and the filler done", len(p.spare), p.filling, refillAt+1)
	}
}

// takeSlots takes n slots, released and closed when the test ends.
func takeSlots(t *testing.T, b *bpfState, n int) []slot {
	t.Helper()
	var taken []slot
	t.Cleanup(func() {
		for _, s := range taken {
			if err := b.releaseSlot(s.n); err != nil {
				t.Error(err)
			}
			s.close()
		}
	})
	for range n {
		s, err := b.takeSlot()
		if err != nil {
			t.Fatal(err)
		}
		taken = append(taken, s)
	}
	return taken
}
