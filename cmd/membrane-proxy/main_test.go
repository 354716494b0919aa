package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestExitsWithParent (root: the listener is transparent): a proxy whose
// parent is gone exits, instead of keeping the port from the next
// agent's proxy.
func TestExitsWithParent(t *testing.T) {
	testutil.RequireRoot(t)
	bin := filepath.Join(testutil.BuildBinariesT(t, "membrane-proxy"), "membrane-proxy")
	xds := filepath.Join(t.TempDir(), "none.sock")
	// The shell starts the proxy in the background, naming itself the
	// parent to watch, and exits.
	out, err := exec.Command("sh", "-c", bin+" --xds "+xds+" --listen 127.0.0.1:0 --parent-pid $$ >/dev/null 2>&1 & echo $!").Output()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("pid %q: %v", out, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	deadline := time.Now().Add(15 * time.Second)
	for {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) || zombie(pid) {
			return // exited (a zombie where init does not reap)
		}
		if time.Now().After(deadline) {
			t.Fatalf("orphaned proxy pid %d still running", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// zombie reports whether pid has exited but not been reaped.
func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}
