package health

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

func TestRecord(t *testing.T) {
	dir := t.TempDir()
	if _, err := readRecord(dir); !errors.Is(err, errNoRecord) {
		t.Fatalf("readRecord of nothing = %v, want errNoRecord", err)
	}
	if err := writeRecord(dir, record{IP: "10.0.0.9", IPv6: "fd00::9"}); err != nil {
		t.Fatal(err)
	}
	r, err := readRecord(dir)
	if err != nil || r.IP != "10.0.0.9" || r.IPv6 != "fd00::9" {
		t.Fatalf("readRecord = %+v, %v", r, err)
	}
	if got := r.addrs(); len(got) != 2 || got[0] != netip.MustParseAddr("10.0.0.9") || got[1] != netip.MustParseAddr("fd00::9") {
		t.Fatalf("addrs = %v, want both", got)
	}
	tests := []struct{ name, data string }{
		{"not json", "{"},
		{"bad ip", `{"ip":"10.0.0.999"}`},
		{"bad ipv6", `{"ip":"10.0.0.9","ipv6":"fd00::zz"}`},
		{"ipv4 as ipv6", `{"ipv6":"10.0.0.9"}`},
		{"no address", `{}`},
		{"empty", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := os.WriteFile(filepath.Join(dir, recordFile), []byte(tt.data), 0o640); err != nil {
				t.Fatal(err)
			}
			if _, err := readRecord(dir); err == nil {
				t.Fatalf("readRecord(%q) succeeded", tt.data)
			}
		})
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add([]byte(`{"ip":"10.0.0.9"}`))
	f.Add([]byte(`{"ip":"fd00::1"}`))
	f.Add([]byte(`{"ip":""}`))
	f.Add([]byte(`{"ip":"10.0.0.9","ipv6":"fd00::1"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := decodeRecord(data)
		if err != nil {
			return
		}
		if len(r.addrs()) == 0 {
			t.Fatalf("decoded a record without an address: %+v", r)
		}
		for _, s := range []string{r.IP, r.IPv6} {
			if _, err := netip.ParseAddr(s); s != "" && err != nil {
				t.Fatalf("decoded a record with a bad address %q", s)
			}
		}
	})
}
