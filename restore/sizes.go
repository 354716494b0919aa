package restore

import (
	"sync/atomic"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// A write overwrites the files of a reused directory in place, and must
// cut a file to length only when the previous content was longer: the
// store remembers the lengths of what it wrote into each directory (one
// ftruncate fewer per file, a quarter of a file write's cost on tmpfs).

// dirSizes packs the lengths of a state directory's ep.json (high half)
// and ep_config.h (low half); a half of unknownSize means unknown (or
// too long to record): such a file is always cut to length.
type dirSizes uint32

const (
	unknownSize  = 0xffff
	unknownSizes = dirSizes(unknownSize<<16 | unknownSize)
	// emptyDir is a directory just created: no files to cut.
	emptyDir = dirSizes(0)
)

func sizesOf(data, header []byte) dirSizes {
	return dirSizes(min(len(data), unknownSize)<<16 | min(len(header), unknownSize))
}

// needsTruncate reports whether a file that held old bytes (one half of
// a dirSizes) must be cut after n bytes were written over it.
func needsTruncate(old uint16, n int) bool { return old == unknownSize || n < int(old) }

func (d dirSizes) state() uint16  { return uint16(d >> 16) }
func (d dirSizes) header() uint16 { return uint16(d) }

// sizeTable holds, per endpoint ID, the sizes of <id> (low 32 bits) and
// of <id>_next (high 32 bits). The writer and its workers update an ID's
// word one at a time (a group holds each ID once), hence atomics. It is
// allocated in chunks of sizeChunk IDs on an ID's first write (a node
// uses few of the 65,536 IDs: a whole table was half a MiB of live heap
// the garbage collector's goal multiplies), and a word holds its value
// XOR unknownWord, so a zero word (an ID never written) reads unknown.
type sizeTable struct {
	chunks [(endpoint.MaxID + 1) / sizeChunk]atomic.Pointer[[sizeChunk]atomic.Uint64]
}

// sizeChunk is the number of IDs per chunk (2 KiB).
const sizeChunk = 256

// unknownWord is both halves unknown.
const unknownWord = uint64(unknownSizes)<<32 | uint64(unknownSizes)

func newSizeTable() *sizeTable { return &sizeTable{} }

func (t *sizeTable) get(id endpoint.ID) (cur, next dirSizes) {
	v := unknownWord
	if c := t.chunks[int(id)/sizeChunk].Load(); c != nil {
		v ^= c[int(id)%sizeChunk].Load()
	}
	return dirSizes(v), dirSizes(v >> 32)
}

func (t *sizeTable) set(id endpoint.ID, cur, next dirSizes) {
	p := &t.chunks[int(id)/sizeChunk]
	c := p.Load()
	if c == nil {
		// A lost race leaves the winner's chunk, which Load returns.
		p.CompareAndSwap(nil, new([sizeChunk]atomic.Uint64))
		c = p.Load()
	}
	c[int(id)%sizeChunk].Store((uint64(next)<<32 | uint64(cur)) ^ unknownWord)
}
