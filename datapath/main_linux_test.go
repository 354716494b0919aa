package datapath

import (
	"os"
	"testing"
)

// TestMain runs the test binary as the socket-LB client process when
// sockClientEnv is set (bpf_kpr_linux_test.go starts it in a cgroup).
func TestMain(m *testing.M) {
	if os.Getenv(sockClientEnv) != "" {
		os.Exit(sockClientMain())
	}
	os.Exit(m.Run())
}
