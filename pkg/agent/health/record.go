package health

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
)

// errNoRecord is returned by readRecord when no address was recorded.
var errNoRecord = errors.New("no health record")

// recordFile is the health endpoint's record in Config.Dir.
const recordFile = "health.json"

// record is what survives the agent: the health endpoint's address.
type record struct {
	IP string `json:"ip"`
}

func readRecord(dir string) (record, error) {
	var r record
	data, err := os.ReadFile(filepath.Join(dir, recordFile))
	if errors.Is(err, os.ErrNotExist) {
		return r, errNoRecord
	}
	if err != nil {
		return r, fmt.Errorf("read health record: %w", err)
	}
	return decodeRecord(data)
}

// decodeRecord parses health.json; the address must parse.
func decodeRecord(data []byte) (record, error) {
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("read health record: %w", err)
	}
	if _, err := netip.ParseAddr(r.IP); err != nil {
		return r, fmt.Errorf("read health record: ip: %w", err)
	}
	return r, nil
}

// writeRecord replaces the record atomically (write, fsync, rename).
func writeRecord(dir string, r record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("write health record: %w", err)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("write health record: %w", err)
	}
	tmp := filepath.Join(dir, "."+recordFile+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("write health record: %w", err)
	}
	_, err = f.Write(append(data, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, recordFile))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write health record: %w", err)
	}
	return nil
}
