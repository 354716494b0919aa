package testutil

import (
	"os"
	"strings"
	"testing"
)

func TestNewNS(t *testing.T) {
	RequireRoot(t)
	var path string
	t.Run("create", func(t *testing.T) {
		ns := NewNS(t, "mbt-util")
		path = ns.Path
		out, err := ns.Exec("ip", "-o", "link", "show", "lo")
		if err != nil || !strings.Contains(out, "UP") {
			t.Fatalf("lo in the new netns: %q, %v", out, err)
		}
		h, err := ns.Handle()
		if err != nil {
			t.Fatal(err)
		}
		h.Close()
	})
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("netns %s left after the test: %v", path, err)
	}
}
