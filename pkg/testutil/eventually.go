package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// EventuallyBound ends a wait that would otherwise hang a test. It is a
// bound, never a measurement: no test asserts how long a wait took.
const EventuallyBound = 60 * time.Second

// Eventually polls cond until it holds and fails tb, naming what, if it
// never does within EventuallyBound. The poll interval starts at 1 ms
// and doubles up to 20 ms, so a condition that holds at once costs
// nothing and a long wait does not spin.
func Eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	EventuallyErr(tb, what, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
}

var errNotYet = fmt.Errorf("condition not met")

// EventuallyErr is Eventually for a condition that says why it does not
// hold yet (nil: it holds); the failure reports the last reason.
func EventuallyErr(tb testing.TB, what string, cond func() error) {
	tb.Helper()
	deadline := time.Now().Add(EventuallyBound)
	wait := time.Millisecond
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s: %v", EventuallyBound, what, err)
		}
		time.Sleep(wait)
		wait = min(2*wait, 20*time.Millisecond)
	}
}

// pollInterval is WaitFor's: its waits are long (a cluster coming up)
// and their conditions ask shared servers (an API server), which a
// tighter poll would load.
const pollInterval = 100 * time.Millisecond

// WaitFor polls cond every 100 ms until it holds and returns an error if
// it does not within limit: for a wait outside a test's goroutine (a
// harness's setup that returns errors) or bounded longer than
// EventuallyBound (kubelet registering a node, a hundred pods starting).
// Like EventuallyBound, limit is a bound, never a measurement.
func WaitFor(limit time.Duration, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not done after %s", limit)
		}
		time.Sleep(pollInterval)
	}
	return nil
}

// BuildBinaries builds the named programs of cmd/ (membrane-agent,
// membrane-cni, ...) into dir as `make build` does: -trimpath, and
// membrane-cni static. It runs the go tool once for each linking.
func BuildBinaries(dir string, names ...string) error {
	var static, dynamic []string
	for _, n := range names {
		pkg := "github.com/membrane-cni/membrane/cmd/" + n
		if n == "membrane-cni" {
			static = append(static, pkg)
		} else {
			dynamic = append(dynamic, pkg)
		}
	}
	if err := build(dir, nil, dynamic); err != nil {
		return err
	}
	return build(dir, []string{"CGO_ENABLED=0"}, static)
}

// BuildStatic builds the packages (import paths, or directories relative
// to the test's package) static and with -trimpath into dir, each
// executable named after its package's last path element, with one run
// of the go tool: programs for a container image or another mount
// namespace (test/e2e's nodes, test/cri's pause image).
func BuildStatic(dir string, pkgs ...string) error {
	return build(dir, []string{"CGO_ENABLED=0"}, pkgs)
}

func build(dir string, env, pkgs []string) error {
	if len(pkgs) == 0 {
		return nil
	}
	cmd := exec.Command("go", append([]string{"build", "-trimpath", "-o", dir + string(filepath.Separator)}, pkgs...)...)
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %v: %w\n%s", pkgs, err, out)
	}
	return nil
}

// BuildBinariesT is BuildBinaries into a directory of tb's, failing tb
// on an error; it returns the directory.
func BuildBinariesT(tb testing.TB, names ...string) string {
	tb.Helper()
	dir := tb.TempDir()
	if err := BuildBinaries(dir, names...); err != nil {
		tb.Fatal(err)
	}
	return dir
}

// RunWithBinaries is a package's TestMain body: it builds the named
// programs once into a temporary directory, stores its path in *dir, runs
// the tests and removes the directory, returning the exit code.
func RunWithBinaries(m *testing.M, dir *string, names ...string) int {
	return RunBuilt(m.Run, dir, names...)
}

// RunBuilt is RunWithBinaries for a TestMain that wraps m.Run itself
// (kubetest.Main): run is called between the build and the removal.
func RunBuilt(run func() int, dir *string, names ...string) int {
	d, err := os.MkdirTemp("", "membrane-test-bin-")
	if err == nil {
		if err = BuildBinaries(d, names...); err != nil {
			os.RemoveAll(d)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*dir = d
	defer os.RemoveAll(d)
	return run()
}
