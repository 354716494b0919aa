package restore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// Persisted says which endpoints have durable state under dir, as the
// next start would find them (Scan): the endpoint directories (an
// <id>_stale without <id> counts), overridden by the journal's records
// beyond its last checkpoint. It reads only, so it may look at the
// directory of a running agent (for tests and tools): the directories
// lag the journal by up to a checkpoint. Whether each state decodes is
// not checked.
func Persisted(dir string) (map[endpoint.ID]bool, error) {
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read state: %w", err)
	}
	names := map[string]bool{}
	for _, e := range entries {
		names[e.Name()] = true
	}
	out := map[endpoint.ID]bool{}
	for name := range names {
		base, stale := strings.CutSuffix(name, staleSuffix)
		id, err := strconv.ParseUint(base, 10, 16)
		if err != nil || id == 0 || (stale && names[base]) {
			continue
		}
		out[endpoint.ID(id)] = true
	}
	recs, err := peekJournal(filepath.Join(dir, journalDir))
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		if r.kind == kindWrite {
			out[r.id] = true
		} else {
			delete(out, r.id)
		}
	}
	return out, nil
}

// peekJournal reads the journal's records beyond its checkpoint, in seq
// order, without changing anything.
func peekJournal(dir string) ([]jrecord, error) {
	var through uint64
	if b, err := os.ReadFile(filepath.Join(dir, checkpointFile)); err == nil {
		for s := 0; (s+1)*markerSlot <= len(b); s++ {
			if seq, ok := decodeMarker(b[s*markerSlot:]); ok {
				through = max(through, seq)
			}
		}
	}
	paths, err := filepath.Glob(filepath.Join(dir, segPrefix+"*"))
	if err != nil {
		return nil, fmt.Errorf("read journal: %w", err)
	}
	var recs []jrecord
	for _, p := range paths {
		if strings.HasSuffix(p, tmpSuffix) {
			continue
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("read journal: %w", err)
		}
		_, rs, _, _ := parseSegment(data, len(data))
		for _, r := range rs {
			if r.seq > through {
				recs = append(recs, r)
			}
		}
	}
	slices.SortFunc(recs, func(a, b jrecord) int { return cmpUint(a.seq, b.seq) })
	return recs, nil
}
