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
// word one at a time (a group holds each ID once), hence atomics.
type sizeTable []atomic.Uint64

func newSizeTable() sizeTable {
	t := make(sizeTable, endpoint.MaxID+1)
	for i := range t {
		t[i].Store(uint64(unknownSizes)<<32 | uint64(unknownSizes))
	}
	return t
}

func (t sizeTable) get(id endpoint.ID) (cur, next dirSizes) {
	v := t[id].Load()
	return dirSizes(v), dirSizes(v >> 32)
}

func (t sizeTable) set(id endpoint.ID, cur, next dirSizes) {
	t[id].Store(uint64(next)<<32 | uint64(cur))
}
