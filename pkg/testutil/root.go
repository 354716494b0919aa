package testutil

import (
	"os"
	"testing"
)

// InCI reports whether the tests run under CI (CI=true or CI=1), where
// every test must run: gates fail instead of skipping.
func InCI() bool {
	v := os.Getenv("CI")
	return v == "true" || v == "1"
}

// RequireRoot skips tb when the process is not root, unless CI is set:
// then it fails, because CI promises root and a skipped root test would
// hide a broken environment.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if InCI() {
		tb.Fatal("test needs root and CI is set: run CI as root")
	}
	tb.Skip("test needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN)")
}
