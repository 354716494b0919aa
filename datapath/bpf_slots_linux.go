package datapath

import (
	"errors"
	"fmt"
	"io"
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
	// release batches the slots being emptied (releaseSlot).
	release slotReleases
}

const (
	// spareSlots are kept filled; a filler writes up to this many at
	// once (their grace periods overlap, so a refill of all of them takes
	// about one). An empty slot costs two map file descriptors and a few
	// hundred bytes of kernel memory (the tries allocate per entry).
	spareSlots = 64
	// refillAt: the spares are refilled once no more than this many are
	// left, not after every take: a refill holds a Go processor for two
	// grace periods (newSlots), and one per CNI ADD made every ADD's
	// realize run beside it.
	refillAt = spareSlots / 2
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
// only when no spare is left) and starts refilling the spares when few
// are left.
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

// fillSlots starts a filler unless one runs or more than refillAt spares
// are left.
func (b *bpfState) fillSlots() {
	p := &b.slots
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.filling || p.closed || len(p.spare) > refillAt {
		return
	}
	p.filling = true
	p.wg.Add(1)
	go b.fill()
}

// fill writes slots, spareSlots-len(spare) at once, until more than
// refillAt spares are left (or a write fails: the next takeSlot tries
// again). It does not top up the few slots taken while a batch was
// written: a batch of one costs the same two grace periods as a batch
// of spareSlots (seen under a stream of ADDs: a 32-slot refill followed
// by six batches of one or two, each ~20 ms); the next takeSlot below
// refillAt starts a full batch instead.
func (b *bpfState) fill() {
	p := &b.slots
	defer p.wg.Done()
	for {
		p.mu.Lock()
		if p.closed || len(p.spare) > refillAt {
			p.filling = false
			p.mu.Unlock()
			return
		}
		want := spareSlots - len(p.spare)
		p.mu.Unlock()
		got := b.newSlots(want)
		p.mu.Lock()
		p.spare = append(p.spare, got...)
		n := len(got)
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
	s, err := b.emptySlot()
	if err != nil {
		return slot{}, err
	}
	if err := b.writeSlot(s.n, s.pm, s.cm); err != nil {
		s.close()
		b.freeSlot(s.n)
		return slot{}, fmt.Errorf("fill policy map slot: %w", err)
	}
	return s, nil
}

// emptySlot reserves a slot number and creates its two empty policy maps
// (not yet in the outer maps).
func (b *bpfState) emptySlot() (slot, error) {
	n, err := b.allocSlot()
	if err != nil {
		return slot{}, err
	}
	s := slot{n: n}
	if s.pm, err = ebpf.NewMap(b.tmpl.policySpec()); err == nil {
		s.cm, err = ebpf.NewMap(b.tmpl.cidrSpec())
	}
	if err != nil {
		s.close()
		b.freeSlot(n)
		return slot{}, fmt.Errorf("fill policy map slot: %w", err)
	}
	return s, nil
}

// newSlots creates up to want slots and writes them to the outer maps
// with one batch update per outer map, one after the other: a batch
// waits for one RCU grace period whatever its size, and one blocking
// syscall at a time leaves the agent's other Go processors free. Writing
// each slot's two entries at once (a goroutine per entry) held both
// processors of a 2-CPU machine for a grace period (~12 ms) right after
// a CNI ADD's Prepare took a slot, and that ADD's realize waited in the
// worker pool's channel until the Go scheduler took a processor back
// from a syscall (1-15 ms for one ADD in five). Slots the batches did
// not write completely are emptied again and not returned.
func (b *bpfState) newSlots(want int) []slot {
	slots := make([]slot, 0, want)
	for range want {
		s, err := b.emptySlot()
		if err != nil {
			break
		}
		slots = append(slots, s)
	}
	keys := make([]uint32, len(slots))
	pfds, cfds := make([]uint32, len(slots)), make([]uint32, len(slots))
	for i, s := range slots {
		keys[i], pfds[i], cfds[i] = s.n, uint32(s.pm.FD()), uint32(s.cm.FD())
	}
	written := len(slots)
	for _, w := range []struct {
		outer *ebpf.Map
		fds   []uint32
	}{{b.maps.policyMaps, pfds}, {b.maps.cidrMaps, cfds}} {
		if written == 0 {
			break
		}
		n, err := w.outer.BatchUpdate(keys[:written], w.fds[:written], nil)
		if errors.Is(err, ebpf.ErrNotSupported) {
			return b.writeSlots(slots)
		}
		if err != nil {
			written = min(written, n)
		}
	}
	for _, s := range slots[written:] {
		// The policy batch may have written it: empty it again (a
		// missing entry is success).
		_ = b.releaseSlot(s.n)
		s.close()
	}
	return slots[:written]
}

// writeSlots writes slots one at a time (kernels without batch updates
// of hash-of-maps maps) and returns those written; the others are freed.
func (b *bpfState) writeSlots(slots []slot) []slot {
	var ok []slot
	for _, s := range slots {
		if err := b.writeSlot(s.n, s.pm, s.cm); err != nil {
			_ = b.releaseSlot(s.n)
			s.close()
			continue
		}
		ok = append(ok, s)
	}
	return ok
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

// releaseSlot deletes slot n from the outer maps and frees its number.
// It waits for grace periods: callers run it off the caller's path.
// Releases made at once share them: the first caller deletes every
// waiting slot with one batch delete per outer map, one map after the
// other, while later callers wait for their batch (a burst of DELs
// emptied their slots two goroutines each, every delete blocking a Go
// processor in bpf() for a grace period, like the refills did before
// newSlots). Deleting a slot that is not in the outer maps is success.
func (b *bpfState) releaseSlot(n uint32) error {
	b.slots.life.RLock()
	defer b.slots.life.RUnlock()
	if b.slots.gone {
		return nil
	}
	r := &b.slots.release
	done := make(chan error, 1)
	r.mu.Lock()
	r.pending = append(r.pending, slotReleaseReq{n: n, done: done})
	lead := !r.running
	r.running = true
	r.mu.Unlock()
	if lead {
		b.releaseBatches()
	}
	return <-done
}

// slotReleases are the releases waiting for a batch; running says a
// caller is deleting batches.
type slotReleases struct {
	mu      sync.Mutex
	pending []slotReleaseReq
	running bool
}

type slotReleaseReq struct {
	n    uint32
	done chan error
}

// releaseBatches deletes batches of waiting slots until none waits.
func (b *bpfState) releaseBatches() {
	r := &b.slots.release
	for {
		r.mu.Lock()
		batch := r.pending
		r.pending = nil
		if len(batch) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		keys := make([]uint32, len(batch))
		for i, req := range batch {
			keys[i] = req.n
		}
		errs := make([]error, len(keys))
		for _, outer := range []*ebpf.Map{b.maps.policyMaps, b.maps.cidrMaps} {
			deleteOuterKeys(outer, keys, errs)
		}
		for i, req := range batch {
			if errs[i] == nil {
				b.freeSlot(req.n)
				req.done <- nil
				continue
			}
			req.done <- fmt.Errorf("empty slot %d: %w", req.n, errs[i])
		}
	}
}

// deleteOuterKeys deletes keys from outer, in batches where the kernel can;
// errs[i] records key i's failure (a missing key is not one). A batch
// stops at its first failing key: the rest go in the next.
func deleteOuterKeys(outer *ebpf.Map, keys []uint32, errs []error) {
	for i := 0; i < len(keys); {
		n, err := outer.BatchDelete(keys[i:], nil)
		if errors.Is(err, ebpf.ErrNotSupported) {
			for ; i < len(keys); i++ {
				if err := outer.Delete(keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					errs[i] = errors.Join(errs[i], err)
				}
			}
			return
		}
		i += n
		if err == nil || i >= len(keys) {
			return
		}
		if !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs[i] = errors.Join(errs[i], err)
		}
		i++ // key i failed (or was missing): the batch goes on after it
	}
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
// caller's path: restart and repair only). stale is the slot the
// endpoints entry named when it did not hold them (0: none): the caller
// releases it once the entry names the new one (releaseStaleSlot).
func (b *bpfState) endpointSlot(id uint32, ifindex int, pm, cm *ebpf.Map) (slot, stale uint32, err error) {
	var v bpf.EndpointEndpointInfo
	if ifindex != 0 && b.maps.endpoints.Lookup(uint32(ifindex), &v) == nil && v.Id == id && v.Slot != 0 {
		if slotHolds(b.maps.policyMaps, v.Slot, pm) && slotHolds(b.maps.cidrMaps, v.Slot, cm) {
			return v.Slot, 0, nil
		}
		stale = v.Slot
	}
	n, err := b.allocSlot()
	if err != nil {
		return 0, 0, err
	}
	if err := b.writeSlot(n, pm, cm); err != nil {
		b.freeSlot(n)
		return 0, 0, err
	}
	return n, stale, nil
}

// releaseStaleSlot empties slot n, found inconsistent at a restart,
// unless an endpoints entry still names it; later, in the pool
// (closeLater: emptying waits for grace periods).
func (l *Linux) releaseStaleSlot(n uint32) error {
	b := l.bpf
	var k uint32
	var v bpf.EndpointEndpointInfo
	it := b.maps.endpoints.Iterate()
	for it.Next(&k, &v) {
		if v.Slot == n {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read endpoints map: %w", err)
	}
	l.closeLater([]io.Closer{slotRelease{b, n}})
	return nil
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
