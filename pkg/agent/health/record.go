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

// record is what survives the agent: the health endpoint's addresses.
// IP holds the IPv4 address (or, written by an agent before dual-stack,
// the IPv6 address of a node without IPv4), IPv6 the IPv6 address.
type record struct {
	IP   string `json:"ip,omitempty"`
	IPv6 string `json:"ipv6,omitempty"`
}

// addrs returns the recorded addresses (decodeRecord checked them).
func (r record) addrs() []netip.Addr {
	var out []netip.Addr
	for _, s := range []string{r.IP, r.IPv6} {
		if ip, err := netip.ParseAddr(s); err == nil {
			out = append(out, ip)
		}
	}
	return out
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
	if r.IP == "" && r.IPv6 == "" {
		return r, fmt.Errorf("read health record: no address")
	}
	if _, err := netip.ParseAddr(r.IP); r.IP != "" && err != nil {
		return r, fmt.Errorf("read health record: ip: %w", err)
	}
	if ip, err := netip.ParseAddr(r.IPv6); r.IPv6 != "" && (err != nil || !ip.Is6()) {
		return r, fmt.Errorf("read health record: ipv6: %q is not an IPv6 address", r.IPv6)
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
