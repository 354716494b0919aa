package restore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// The journal's on-disk format. A segment file starts with a header
// (segHeaderSize bytes: magic, generation, CRC) and holds records back to
// back after it. A record is
//
//	magic u32 | crc u32 | len u32 | gen u32 | seq u64 | id u16 | kind u8 | 0 u8 | payload [len]
//
// little endian; the CRC (Castagnoli) covers everything after itself,
// payload included. gen is the generation of the segment the record was
// appended to: a recycled segment gets a new generation, so the records
// of its previous life are never read as new ones. seq grows by one per
// record across segments.

const (
	segMagic      = "MBRJSEG1"
	segHeaderSize = 64
	recMagic      = 0x4a52424d // "MBRJ"
	recHeaderSize = 28
)

// recKind says what a record does to its endpoint's state.
type recKind uint8

const (
	kindWrite      recKind = 1 // payload: ep.json
	kindRemove     recKind = 2 // tombstone
	kindQuarantine recKind = 3 // tombstone; the state moves to the quarantine
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// jrecord is a decoded record; payload aliases the buffer it came from.
type jrecord struct {
	gen     uint32
	seq     uint64
	id      endpoint.ID
	kind    recKind
	payload []byte
}

// errBadRecord is a record that does not parse or check; errNoRecord is
// a position that holds no record at all (zeros: the segment's unused
// tail).
var (
	errBadRecord = errors.New("bad journal record")
	errNoRecord  = errors.New("no journal record")
)

// appendRecord appends r's encoding to b.
func appendRecord(b []byte, r jrecord) []byte {
	n := len(b)
	b = binary.LittleEndian.AppendUint32(b, recMagic)
	b = binary.LittleEndian.AppendUint32(b, 0) // crc, below
	b = binary.LittleEndian.AppendUint32(b, uint32(len(r.payload)))
	b = binary.LittleEndian.AppendUint32(b, r.gen)
	b = binary.LittleEndian.AppendUint64(b, r.seq)
	b = binary.LittleEndian.AppendUint16(b, uint16(r.id))
	b = append(b, byte(r.kind), 0)
	b = append(b, r.payload...)
	binary.LittleEndian.PutUint32(b[n+4:], crc32.Checksum(b[n+8:], castagnoli))
	return b
}

// recordSize is the encoded size of a record with a payload of n bytes.
func recordSize(n int) int { return recHeaderSize + n }

// decodeRecord decodes the record at the start of b and returns it and
// its encoded size; maxPayload bounds the length it accepts.
func decodeRecord(b []byte, maxPayload int) (jrecord, int, error) {
	if len(b) < recHeaderSize {
		return jrecord{}, 0, errNoRecord
	}
	magic := binary.LittleEndian.Uint32(b)
	if magic == 0 {
		return jrecord{}, 0, errNoRecord
	}
	if magic != recMagic {
		return jrecord{}, 0, errBadRecord
	}
	n := int(binary.LittleEndian.Uint32(b[8:]))
	if n > maxPayload || recHeaderSize+n > len(b) {
		return jrecord{}, 0, errBadRecord
	}
	size := recHeaderSize + n
	if crc32.Checksum(b[8:size], castagnoli) != binary.LittleEndian.Uint32(b[4:]) {
		return jrecord{}, 0, errBadRecord
	}
	r := jrecord{
		gen: binary.LittleEndian.Uint32(b[12:]), seq: binary.LittleEndian.Uint64(b[16:]),
		id: endpoint.ID(binary.LittleEndian.Uint16(b[24:])), kind: recKind(b[26]), payload: b[recHeaderSize:size:size],
	}
	switch {
	case b[27] != 0, r.id == 0, r.id > endpoint.MaxID:
		return jrecord{}, 0, errBadRecord
	case r.kind == kindWrite && n > 0:
	case (r.kind == kindRemove || r.kind == kindQuarantine) && n == 0:
	default:
		return jrecord{}, 0, errBadRecord
	}
	return r, size, nil
}

// appendSegHeader appends the header of a segment of generation gen.
func appendSegHeader(b []byte, gen uint32) []byte {
	n := len(b)
	b = append(b, segMagic...)
	b = binary.LittleEndian.AppendUint32(b, gen)
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[n:], castagnoli))
	return append(b, make([]byte, segHeaderSize-(len(b)-n))...)
}

// segGen returns the generation in a segment's header; ok is false for
// a header that does not check (a segment never used, or torn).
func segGen(b []byte) (gen uint32, ok bool) {
	if len(b) < segHeaderSize || !bytes.Equal(b[:8], []byte(segMagic)) {
		return 0, false
	}
	if crc32.Checksum(b[:12], castagnoli) != binary.LittleEndian.Uint32(b[12:]) {
		return 0, false
	}
	return binary.LittleEndian.Uint32(b[8:]), true
}

// corruptSpan is a stretch of a segment that holds no valid record and
// is followed by valid ones: damage in the middle of the journal.
type corruptSpan struct{ off, end int }

// parseSegment reads a segment's records in order. Parsing stops at the
// first position without a valid record of the segment's generation
// (the tail: unused, or torn by a crash during an append), unless a valid
// record follows further on: then what lies between is reported as
// corrupt and parsing goes on from there. ok is false when the header
// does not check (no records).
func parseSegment(b []byte, maxPayload int) (gen uint32, recs []jrecord, bad []corruptSpan, ok bool) {
	gen, ok = segGen(b)
	if !ok {
		return 0, nil, nil, false
	}
	var last uint64
	valid := func(r jrecord, err error) bool { return err == nil && r.gen == gen && r.seq > last }
	for off := segHeaderSize; off < len(b); {
		r, n, err := decodeRecord(b[off:], maxPayload)
		if valid(r, err) {
			recs, last, off = append(recs, r), r.seq, off+n
			continue
		}
		next := findRecord(b, off+1, maxPayload, valid)
		if next < 0 {
			break
		}
		bad = append(bad, corruptSpan{off: off, end: next})
		off = next
	}
	return gen, recs, bad, true
}

// findRecord returns the offset of the first record at or after from
// that valid accepts, or -1.
func findRecord(b []byte, from, maxPayload int, valid func(jrecord, error) bool) int {
	var magic [4]byte
	binary.LittleEndian.PutUint32(magic[:], recMagic)
	for from < len(b) {
		i := bytes.Index(b[from:], magic[:])
		if i < 0 {
			return -1
		}
		off := from + i
		if r, _, err := decodeRecord(b[off:], maxPayload); valid(r, err) {
			return off
		}
		from = off + 1
	}
	return -1
}
