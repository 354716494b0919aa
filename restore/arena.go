package restore

import "sync"

// The records waiting for a checkpoint keep their ep.json and
// ep_config.h bytes for up to a checkpoint interval. Rather than hold
// each request's pooled encoding buffer that long (the pool then runs dry
// and every write allocates one), the appender copies the bytes into
// slabs, releases the buffer at once, and the checkpointer hands a slab
// back once no waiting record points into it.

// slabSize is the size of a slab; a larger record gets a slab of its own.
const slabSize = 64 << 10

// maxFreeSlabs bounds the slabs kept for reuse (a burst's are dropped).
const maxFreeSlabs = 64

// slab is a piece of the arena; refs counts the records in it not yet
// checkpointed.
type slab struct {
	buf  []byte
	refs int
}

// arena hands out slabs. The appender fills cur; mu guards refs, cur
// and free (the checkpointer drops references).
type arena struct {
	mu   sync.Mutex
	cur  *slab
	free []*slab
}

// copy copies data and header into the arena, one after the other, and
// returns the copies and the slab they are in.
func (a *arena) copy(data, header []byte) ([]byte, []byte, *slab) {
	n := len(data) + len(header)
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.cur
	if s == nil || len(s.buf)+n > cap(s.buf) {
		if s != nil && s.refs == 0 {
			a.put(s)
		}
		s = a.get(n)
		a.cur = s
	}
	off := len(s.buf)
	s.buf = append(append(s.buf, data...), header...)
	s.refs++
	return s.buf[off : off+len(data) : off+len(data)], s.buf[off+len(data) : off+n : off+n], s
}

// get returns an empty slab of at least n bytes. a.mu held.
func (a *arena) get(n int) *slab {
	if k := len(a.free); k > 0 && n <= slabSize {
		s := a.free[k-1]
		a.free = a.free[:k-1]
		return s
	}
	return &slab{buf: make([]byte, 0, max(n, slabSize))}
}

// put keeps an emptied slab for reuse. a.mu held.
func (a *arena) put(s *slab) {
	if cap(s.buf) == slabSize && len(a.free) < maxFreeSlabs {
		s.buf = s.buf[:0]
		a.free = append(a.free, s)
	}
}

// drop releases the records of rs from their slabs.
func (a *arena) drop(rs []request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range rs {
		s := rs[i].slab
		if s == nil {
			continue
		}
		rs[i].slab, rs[i].data, rs[i].header = nil, nil, nil
		if s.refs--; s.refs == 0 && s != a.cur {
			a.put(s)
		}
	}
}
