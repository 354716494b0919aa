package restore

import (
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/endpoint"
	"github.com/membrane-cni/membrane/pkg/labels"
)

func testStore(t *testing.T) *Store {
	t.Helper()
	s, err := Open(t.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func testEndpoint(t *testing.T, id endpoint.ID) *endpoint.Endpoint {
	t.Helper()
	ls, err := labels.ParseSet([]string{"k8s:app=web"})
	if err != nil {
		t.Fatal(err)
	}
	return &endpoint.Endpoint{ID: id, ContainerID: "c", Labels: ls, IPv4: netip.MustParseAddr("10.0.0.5"),
		Identity: 256, Created: time.Unix(1, 0).UTC()}
}

func wait(t *testing.T, submit func(done func(error))) {
	t.Helper()
	errc := make(chan error, 1)
	submit(func(err error) { errc <- err })
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestRemoveCrashPoints: whatever a removal left behind when the agent
// died, Scan restores the whole state or nothing, never quarantines.
func TestRemoveCrashPoints(t *testing.T) {
	tests := []struct {
		name    string
		damage  func(t *testing.T, dir string) // dir holds state 7 when called
		restore bool
	}{
		{"renamed, files half removed", func(t *testing.T, dir string) {
			mustRename(t, filepath.Join(dir, "7"), filepath.Join(dir, "7_deleted"))
			mustRemove(t, filepath.Join(dir, "7_deleted", stateFile))
		}, false},
		{"stale backup half removed before the rename", func(t *testing.T, dir string) {
			copyDir(t, filepath.Join(dir, "7"), filepath.Join(dir, "7_stale"))
			mustRemove(t, filepath.Join(dir, "7_stale", stateFile))
		}, true},
		{"renamed, files intact", func(t *testing.T, dir string) {
			mustRename(t, filepath.Join(dir, "7"), filepath.Join(dir, "7_deleted"))
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := testStore(t)
			wait(t, func(done func(error)) { s.Write(testEndpoint(t, 7), done) })
			tt.damage(t, s.Dir())
			eps, bad := s.Scan()
			if len(bad) != 0 {
				t.Fatalf("Scan quarantined %+v", bad)
			}
			if got := len(eps) == 1; got != tt.restore {
				t.Fatalf("restored %d endpoints, want restore=%v", len(eps), tt.restore)
			}
			if _, err := os.Stat(filepath.Join(s.Dir(), "7_deleted")); !os.IsNotExist(err) {
				t.Fatalf("7_deleted left behind: %v", err)
			}
		})
	}
}

// TestRemoveLeavesNothing: Remove deletes the state, its backup and any
// interrupted write, and removing missing state is success.
func TestRemoveLeavesNothing(t *testing.T) {
	s := testStore(t)
	wait(t, func(done func(error)) { s.Write(testEndpoint(t, 3), done) })
	copyDir(t, filepath.Join(s.Dir(), "3"), filepath.Join(s.Dir(), "3_stale"))
	copyDir(t, filepath.Join(s.Dir(), "3"), filepath.Join(s.Dir(), "3_next"))
	wait(t, func(done func(error)) { s.Remove(3, done) })
	wait(t, func(done func(error)) { s.Remove(3, done) })
	entries, _ := os.ReadDir(s.Dir())
	if len(entries) != 0 {
		t.Fatalf("state dir holds %s after Remove", entries[0].Name())
	}
}

func mustRename(t *testing.T, from, to string) {
	t.Helper()
	if err := os.Rename(from, to); err != nil {
		t.Fatal(err)
	}
}

func mustRemove(t *testing.T, p string) {
	t.Helper()
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	if err := os.Mkdir(to, 0o750); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), data, 0o640); err != nil {
			t.Fatal(err)
		}
	}
}
