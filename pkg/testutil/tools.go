package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// RequireTool returns the path of the program name, looked up in PATH and
// then in dirs. When it is missing, tb is skipped, unless CI is set: then
// it fails, because CI promises the tools .ci/run installs.
func RequireTool(tb testing.TB, name string, dirs ...string) string {
	tb.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	if InCI() {
		tb.Fatalf("test needs %s and CI is set: .ci/run installs it", name)
	}
	tb.Skipf("test needs %s (not in PATH or %v)", name, dirs)
	return ""
}
