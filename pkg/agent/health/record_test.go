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
	if err := writeRecord(dir, record{IP: "10.0.0.9"}); err != nil {
		t.Fatal(err)
	}
	r, err := readRecord(dir)
	if err != nil || r.IP != "10.0.0.9" {
		t.Fatalf("readRecord = %+v, %v", r, err)
	}
	tests := []struct{ name, data string }{
		{"not json", "{"},
		{"bad ip", `{"ip":"10.0.0.999"}`},
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
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := decodeRecord(data)
		if err != nil {
			return
		}
		if _, err := netip.ParseAddr(r.IP); err != nil {
			t.Fatalf("decoded a record with a bad address %q", r.IP)
		}
	})
}
