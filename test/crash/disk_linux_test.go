package crash

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// tmpfsT mounts a tmpfs of size bytes on dir (unmounted at cleanup).
func tmpfsT(t *testing.T, dir string, size int) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0750", size)); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}

// fill writes a file until the file system is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill: %v", err)
			}
			return
		}
	}
}

// TestFullStateDisk: with the state directory's file system full, a PUT
// fails with 507 state-disk-full and leaves no endpoint, no state and no
// address behind (once the caller releases it, as membrane-cni does), and
// GET /v1/status says the state directory is full (TestStateDiskFaults
// has the read-only and failing-I/O directories); a
// killed agent restarts on the full disk without crash-looping, keeps its
// endpoints, and recovers when space is freed.
func TestFullStateDisk(t *testing.T) {
	testutil.RequireRoot(t)
	ap := newAgentProc(t, "10.251.0.0/24", "--datapath", "fake", "--gc-interval", "-1s")
	tmpfsT(t, ap.StateDir, 256<<10)
	ap.Start()
	c := client.New(ap.Socket)
	defer c.Close()
	d := &clientDriver{t: t, agent: ap, c: c}
	w := newWorld(1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for range 3 {
		p := w.newPod()
		if err := d.add(ctx, p); err != nil {
			t.Fatal(err)
		}
		w.set(p, podLive)
	}
	filler := filepath.Join(ap.StateDir, "filler")
	fill(t, filler)

	p := w.newPod()
	err := d.add(ctx, p) // releases the address after the failure
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != 507 || ae.Code != "state-disk-full" {
		t.Fatalf("PUT on a full disk = %v, want 507 state-disk-full", err)
	}
	w.set(p, podGone)
	checkRolledBack(t, ctx, c, ap.StateDir, 3)
	if st, err := c.Status(ctx); err != nil || st.StateDir == nil || st.StateDir.Healthy || st.StateDir.Cause != "disk-full" {
		t.Fatalf("status on a full disk: %+v, %v; want the state dir unhealthy, cause disk-full", st.StateDir, err)
	}

	// A restart on the full disk: ready, endpoints kept (their
	// regeneration retries until space is back).
	ap.Kill()
	ap.Start()
	time.Sleep(500 * time.Millisecond) // give a crash loop the chance to show
	select {
	case <-ap.Exited():
		t.Fatal("agent exited on a full state disk")
	default:
	}
	if eps, err := c.EndpointList(ctx, nil); err != nil || len(eps) != 3 {
		t.Fatalf("endpoints after a restart on a full disk: %d, %v; want 3", len(eps), err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	checkRestart(t, c, w, ap.StateDir, persisted(t, ap.StateDir))
	testutil.EventuallyErr(t, "the state dir healthy once space is back", func() error {
		if st, err := c.Status(ctx); err != nil || st.StateDir == nil || !st.StateDir.Healthy {
			return fmt.Errorf("status: %+v, %v", st.StateDir, err)
		}
		return nil
	})
	q := w.newPod()
	if err := d.add(ctx, q); err != nil {
		t.Fatalf("PUT after space came back: %v", err)
	}
}

// checkRolledBack: after a failed PUT, want endpoints remain, addresses
// are only theirs, and the state directory holds only their state (and
// the filler).
func checkRolledBack(t *testing.T, ctx context.Context, c *client.Client, stateDir string, want int) {
	t.Helper()
	checkAddresses(t, ctx, c, stateDir)
	eps, _ := c.EndpointList(ctx, nil)
	if len(eps) != want {
		t.Fatalf("%d endpoints after the failed PUT, want %d", len(eps), want)
	}
	known := map[string]bool{"filler": true}
	for _, ep := range eps {
		known[fmt.Sprint(ep.ID)] = true
	}
	// trash/ and <id>_next are the store's scratch, never read as state,
	// journal/ its write-ahead journal (restore/doc.go); anything else is
	// a half-made endpoint.
	known["trash"], known["journal"] = true, true
	entries, _ := os.ReadDir(stateDir)
	for _, e := range entries {
		if !known[e.Name()] && !strings.HasSuffix(e.Name(), "_next") {
			t.Fatalf("state dir holds %s after the failed PUT", e.Name())
		}
	}
}
