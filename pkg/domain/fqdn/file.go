package fqdn

import (
	"encoding/json"
	"fmt"
	"time"
)

// fileVersion is the version of the persisted cache's format (File).
const fileVersion = 1

// File is the persisted form of a Cache (<state-dir>/fqdn.json, written
// by the policy actor, read at agent start): a stable format, apart
// from the cache's own types.
type File struct {
	Version int     `json:"version"`
	Entries []Entry `json:"entries"`
}

// MarshalFile encodes entries as a File.
func MarshalFile(entries []Entry) ([]byte, error) {
	if entries == nil {
		entries = []Entry{}
	}
	b, err := json.Marshal(File{Version: fileVersion, Entries: entries})
	if err != nil {
		return nil, fmt.Errorf("encode fqdn cache: %w", err)
	}
	return b, nil
}

// ParseFile decodes a File and returns its entries still alive at now
// (an expired entry is not restored: its answer's TTL ended while no
// agent ran). Returns an error for another version or malformed data.
func ParseFile(data []byte, now time.Time) ([]Entry, error) {
	var f File
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("decode fqdn cache: %w", err)
	}
	if f.Version != fileVersion {
		return nil, fmt.Errorf("decode fqdn cache: version %d, want %d", f.Version, fileVersion)
	}
	out := f.Entries[:0]
	for _, e := range f.Entries {
		if e.Expires.After(now) && e.IP.IsValid() && e.Name != "" {
			out = append(out, e)
		}
	}
	return out, nil
}
