package datapath

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/membrane-cni/membrane/bpf"
)

// A slot is an entry of the outer maps policy_maps and cidr_maps: one
// endpoint's two policy maps under one key, which the endpoint's entry in
// the endpoints map names (bpf/endpoint.h). Every user-space write to a
// map of maps waits for an RCU grace period (the kernel's
// maybe_wait_bpf_programs, ~12 ms here), so slots are filled ahead of
// time, off the CNI ADD's path: a new endpoint takes a filled slot (two
// empty maps already in the outer maps) and pins its maps under its
// directory; a removed endpoint's slot is emptied from the outer maps in
// the background. Slots are never reused while in the outer maps.
type slot struct {
	n      uint32
	pm, cm *ebpf.Map
}

func (s slot) close() {
	for _, m := range []*ebpf.Map{s.pm, s.cm} {
		if m != nil {
			m.Close()
		}
	}
}

// slotPool holds the filled spare slots and the slot numbers in use.
type slotPool struct {
	mu      sync.Mutex
	spare   []slot
	used    map[uint32]bool // in the outer maps, or being written or emptied
	cursor  uint32
	filling bool
	closed  bool
	wg      sync.WaitGroup
	// life: a release (in the worker pool, maybe after the agent closed
	// the outer maps) holds it for reading; gone says the maps are
	// closed: the release is left to the next agent (initSlots).
	life sync.RWMutex
	gone bool
}

const (
	// spareSlots are kept filled; a filler writes up to this many at
	// once (their grace periods overlap, so a refill of all of them takes
	// about one). An empty slot costs two map file descriptors and a few
	// hundred bytes of kernel memory (the tries allocate per entry).
	spareSlots = 64
	// maxSlot: the outer maps hold 65,536 entries; slot 0 is none.
	maxSlot = 65535
)

// initSlots records the slots a previous agent left in the outer maps.
// Those no endpoints entry names (its spares, or endpoints removed
// while it ran) are emptied in the background; the others stay for
// their endpoints to be adopted. Then the spares are filled.
func (b *bpfState) initSlots() error {
	named := map[uint32]bool{}
	var k uint32
	var v bpf.EndpointEndpointInfo
	it := b.maps.endpoints.Iterate()
	for it.Next(&k, &v) {
		named[v.Slot] = true
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read endpoints map: %w", err)
	}
	var stale []uint32
	b.slots.used = map[uint32]bool{}
	for _, outer := range []*ebpf.Map{b.maps.policyMaps, b.maps.cidrMaps} {
		var inner ebpf.MapID
		it := outer.Iterate()
		for it.Next(&k, &inner) {
			if !b.slots.used[k] && !named[k] {
				stale = append(stale, k)
			}
			b.slots.used[k] = true
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("read outer map: %w", err)
		}
	}
	if len(stale) > 0 {
		b.slots.wg.Add(1)
		go func() {
			defer b.slots.wg.Done()
			for _, n := range stale {
				_ = b.releaseSlot(n)
			}
		}()
	}
	b.fillSlots()
	return nil
}

// takeSlot hands out a filled slot (filling one on the caller's path
// only when no spare is left) and starts refilling the spares.
func (b *bpfState) takeSlot() (slot, error) {
	p := &b.slots
	p.mu.Lock()
	var s slot
	if n := len(p.spare); n > 0 {
		s, p.spare = p.spare[n-1], p.spare[:n-1]
	}
	p.mu.Unlock()
	b.fillSlots()
	if s.n != 0 {
		return s, nil
	}
	return b.newSlot()
}

// fillSlots starts a filler unless one runs or the spares are full.
func (b *bpfState) fillSlots() {
	p := &b.slots
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.filling || p.closed || len(p.spare) >= spareSlots {
		return
	}
	p.filling = true
	p.wg.Add(1)
	go b.fill()
}

// fill writes slots, spareSlots-len(spare) at once, until the spares
// are full (or a write fails: the next takeSlot tries again).
func (b *bpfState) fill() {
	p := &b.slots
	defer p.wg.Done()
	for {
		p.mu.Lock()
		want := spareSlots - len(p.spare)
		if p.closed || want <= 0 {
			p.filling = false
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		got := make(chan slot, want)
		var wg sync.WaitGroup
		for range want {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if s, err := b.newSlot(); err == nil {
					got <- s
				}
			}()
		}
		wg.Wait()
		close(got)
		p.mu.Lock()
		n := 0
		for s := range got {
			p.spare = append(p.spare, s)
			n++
		}
		if n < want {
			p.filling = false
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
	}
}

// newSlot creates two empty policy maps and writes them to a free slot.
func (b *bpfState) newSlot() (slot, error) {
	n, err := b.allocSlot()
	if err != nil {
		return slot{}, err
	}
	s := slot{n: n}
	if s.pm, err = ebpf.NewMap(b.tmpl.policySpec()); err == nil {
		s.cm, err = ebpf.NewMap(b.tmpl.cidrSpec())
	}
	if err == nil {
		err = b.writeSlot(n, s.pm, s.cm)
	}
	if err != nil {
		s.close()
		b.freeSlot(n)
		return slot{}, fmt.Errorf("fill policy map slot: %w", err)
	}
	return s, nil
}

// writeSlot writes pm and cm to slot n of the outer maps: both writes at
// once, so that their grace periods overlap.
func (b *bpfState) writeSlot(n uint32, pm, cm *ebpf.Map) error {
	var cerr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		cerr = b.maps.cidrMaps.Update(n, cm, ebpf.UpdateAny)
	}()
	perr := b.maps.policyMaps.Update(n, pm, ebpf.UpdateAny)
	<-done
	if err := errors.Join(perr, cerr); err != nil {
		return fmt.Errorf("write slot %d: %w", n, err)
	}
	return nil
}

// releaseSlot deletes slot n from the outer maps (both at once) and frees
// its number. It waits for grace periods: callers run it off the
// caller's path.
func (b *bpfState) releaseSlot(n uint32) error {
	b.slots.life.RLock()
	defer b.slots.life.RUnlock()
	if b.slots.gone {
		return nil
	}
	var cerr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		cerr = b.maps.cidrMaps.Delete(n)
	}()
	perr := b.maps.policyMaps.Delete(n)
	<-done
	var errs []error
	for _, err := range []error{perr, cerr} {
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("empty slot %d: %w", n, err)
	}
	b.freeSlot(n)
	return nil
}

// slotRelease is releaseSlot as an io.Closer (closeLater).
type slotRelease struct {
	b *bpfState
	n uint32
}

func (r slotRelease) Close() error { return r.b.releaseSlot(r.n) }

// allocSlot reserves a slot number: the first free one after the cursor,
// so that a number is not reused right after it was freed.
func (b *bpfState) allocSlot() (uint32, error) {
	p := &b.slots
	p.mu.Lock()
	defer p.mu.Unlock()
	for range maxSlot {
		p.cursor = p.cursor%maxSlot + 1
		if !p.used[p.cursor] {
			p.used[p.cursor] = true
			return p.cursor, nil
		}
	}
	return 0, errors.New("all policy map slots in use")
}

func (b *bpfState) freeSlot(n uint32) {
	b.slots.mu.Lock()
	delete(b.slots.used, n)
	b.slots.mu.Unlock()
}

// closeSlots stops the fillers and closes the spares' file descriptors
// (the spares stay in the outer maps; the next agent empties them).
func (b *bpfState) closeSlots() {
	p := &b.slots
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.wg.Wait()
	p.mu.Lock()
	for _, s := range p.spare {
		s.close()
	}
	p.spare = nil
	p.mu.Unlock()
	p.life.Lock()
	p.gone = true
	p.life.Unlock()
}

// endpointSlot returns the slot of a previous agent's endpoint id on
// ifindex holding exactly pm and cm, or writes them to a new slot (on the
// caller's path: restart and repair only).
func (b *bpfState) endpointSlot(id uint32, ifindex int, pm, cm *ebpf.Map) (uint32, error) {
	var v bpf.EndpointEndpointInfo
	if ifindex != 0 && b.maps.endpoints.Lookup(uint32(ifindex), &v) == nil && v.Id == id && v.Slot != 0 {
		if slotHolds(b.maps.policyMaps, v.Slot, pm) && slotHolds(b.maps.cidrMaps, v.Slot, cm) {
			return v.Slot, nil
		}
	}
	n, err := b.allocSlot()
	if err != nil {
		return 0, err
	}
	if err := b.writeSlot(n, pm, cm); err != nil {
		b.freeSlot(n)
		return 0, err
	}
	return n, nil
}

// slotHolds reports whether outer holds m at slot n.
func slotHolds(outer *ebpf.Map, n uint32, m *ebpf.Map) bool {
	var inner ebpf.MapID
	if err := outer.Lookup(n, &inner); err != nil {
		return false
	}
	info, err := m.Info()
	if err != nil {
		return false
	}
	id, ok := info.ID()
	return ok && id == inner
}
