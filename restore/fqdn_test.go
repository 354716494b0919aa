package restore

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWriteFQDN: the file is replaced whole, no temporary file stays,
// and a missing file reads as nothing.
func TestWriteFQDN(t *testing.T) {
	dir := t.TempDir()
	if b, err := ReadFQDN(dir); b != nil || err != nil {
		t.Fatalf("ReadFQDN of an empty directory = %q, %v", b, err)
	}
	for _, data := range []string{`{"version":1,"entries":[{"name":"long"}]}`, `{"version":1,"entries":[]}`} {
		if err := WriteFQDN(dir, []byte(data)); err != nil {
			t.Fatal(err)
		}
		if b, err := ReadFQDN(dir); string(b) != data || err != nil {
			t.Fatalf("ReadFQDN = %q, %v; want %q", b, err, data)
		}
	}
	names, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(names) != 1 || filepath.Base(names[0]) != FQDNFile {
		t.Errorf("directory holds %v, want only %s", names, FQDNFile)
	}
	if err := WriteFQDN(filepath.Join(dir, "missing"), []byte("x")); err == nil {
		t.Error("WriteFQDN into a missing directory succeeded")
	}
	if _, err := os.Stat(filepath.Join(dir, "missing", FQDNFile+tmpSuffix)); err == nil {
		t.Error("temporary file left behind")
	}
}
