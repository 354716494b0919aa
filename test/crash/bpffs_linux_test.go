package crash

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

// TestBPFPinsRemoved: under a running agent (linux datapath, pods on
// veths with a policy) every pin under its bpffs is removed, as an
// operator's `rm -rf /sys/fs/bpf/membrane` would, and later the bpffs
// itself is unmounted and a fresh one mounted in its place, as a node
// agent remounting /sys/fs/bpf would (the node's own bpffs instance:
// the host's is never touched). Between the two, an rm -rf that the
// agent's check interrupts: the ipcache pin goes, the agent pins it
// again, then every other pin goes. Each time the policy stays enforced
// (the allowed pod gets through, the denied one does not), the agent
// finds the pins missing and pins its objects again (the same kernel
// maps: the ipcache's map ID is unchanged), and says so: a
// bpf-pins-repaired event, membrane_datapath_pin_repairs_total, and GET
// /v1/status's bpf-pins. A new pod's ADD then works and is enforced, and
// an agent killed with SIGKILL restarts onto the re-pinned maps (the same
// ipcache map) with every endpoint as before. Both ways of attaching the
// endpoint programs: cls_bpf filters (the default; the filters hold the
// programs) and TCX links, which a removed pin would detach if the agent
// did not hold them (the pods' traffic then unfiltered).
func TestBPFPinsRemoved(t *testing.T) {
	for _, tc := range []struct{ attach, cidr string }{{"tc", "10.245.0.0/24"}, {"tcx", "10.244.0.0/24"}} {
		t.Run(tc.attach, func(t *testing.T) { testPinsRemoved(t, tc.attach, tc.cidr) })
	}
}

func testPinsRemoved(t *testing.T, attach, cidr string) {
	n := nodeharness.New(t, nodeharness.Options{Prefix: "mbc-pins", IPv4Range: cidr, Network: "crash-pins-" + attach,
		MTU: 1400, OwnBPFFS: true})
	ap := &agentProc{Node: n, Proc: n.Process("--teardown-delay", "100ms", "--enable-health=false", "--bpffs-check-interval", "300ms",
		"--bpf-attach", attach)}
	ap.Start()
	c := client.New(ap.Socket)
	defer c.Close()
	ctx := context.Background()
	srv, enforced := policyPods(t, n, c)
	testutil.EventuallyErr(t, "policy enforced before the pins go", func() error { return enforced("before") })
	before := endpointSnapshot(t, c)
	srvEp, err := c.EndpointGet(ctx, "container-id:"+srv.RT.ContainerID)
	if err != nil {
		t.Fatal(err)
	}
	ipcache := filepath.Join(ap.BPFFS, "ipcache")
	srvPolicy := filepath.Join(ap.BPFFS, "endpoints", strconv.Itoa(int(srvEp.ID)), "policy")
	ipcacheID := pinnedMapID(t, ipcache)
	pinsBefore := pinTree(t, ap.BPFFS)
	repairs := watchEvents(t, c, events.BPFPinsRepaired)
	repairsBefore, repinnedBefore := 0, 0

	faults := []struct {
		name string
		do   func()
	}{
		{"rm -rf of every pin", func() { removeAllUnder(t, ap.BPFFS) }},
		{"rm -rf interrupted by the agent's check", func() {
			pinned := pinFile(t, ipcache)
			if err := os.Remove(ipcache); err != nil {
				t.Fatal(err)
			}
			testutil.EventuallyErr(t, "the ipcache pin alone pinned again", func() error {
				if f, err := pinFileErr(ipcache); err != nil || f == pinned {
					return fmt.Errorf("pin %v (before the fault %v), %v", f, pinned, err)
				}
				return nil
			})
			removeAllUnder(t, ap.BPFFS, "ipcache")
		}},
		{"the bpffs unmounted and a fresh one mounted", func() { remountBPFFS(t, ap.BPFFS) }},
	}
	for i, fault := range faults {
		start := time.Now()
		pinned := pinFile(t, ipcache)
		// The agent's check may repair the pins before this goroutine
		// looks (every 300 ms; an rm -rf under load takes longer): what
		// shows that the fault took the ipcache pin is a new pin file
		// after it (a new inode, or a new bpffs), checked below.
		fault.do()
		if err := enforced("pins gone (" + fault.name + ")"); err != nil {
			t.Error(err)
		}
		repairs.wait(t, func(ev events.Event) bool { return ev.State == "repaired" }, i+1)
		// A check may run in the middle of a fault (rm -rf removing one
		// pin after another, the bpffs between its unmount and the new
		// mount) and repair what is gone so far; the rest is repaired by
		// the next check.
		testutil.EventuallyErr(t, "pins back after "+fault.name, func() error {
			if got := pinTree(t, ap.BPFFS); fmt.Sprint(got) != fmt.Sprint(pinsBefore) {
				return fmt.Errorf("pins:\n%v\nwant those of before:\n%v", got, pinsBefore)
			}
			return nil
		})
		t.Logf("%s: repaired after %v", fault.name, time.Since(start).Round(time.Millisecond))
		if _, err := os.Stat(srvPolicy); err != nil {
			t.Errorf("%s: srv's policy pin: %v", fault.name, err)
		}
		if f := pinFile(t, ipcache); f == pinned {
			t.Errorf("%s: the ipcache pin is the file of before the fault (%+v): the fault removed nothing", fault.name, f)
		}
		if id := pinnedMapID(t, ipcache); id != ipcacheID {
			t.Errorf("%s: the ipcache pin holds map %d, want the agent's map %d", fault.name, id, ipcacheID)
		}
		// A check in the middle of a fault finds pins missing more than
		// once: at least one more repair than before, each repinning.
		st, err := c.Status(ctx)
		if err != nil || st.BPFPins == nil || !st.BPFPins.Healthy || st.BPFPins.Repairs <= repairsBefore || st.BPFPins.Repinned <= repinnedBefore {
			t.Errorf("%s: status bpf-pins %+v, %v; want healthy with more than %d repairs, more than %d pinned again", fault.name, st.BPFPins, err, repairsBefore, repinnedBefore)
		} else {
			t.Logf("%s: status: %d repairs: %s", fault.name, st.BPFPins.Repairs-repairsBefore, st.BPFPins.LastMessage)
			repairsBefore, repinnedBefore = st.BPFPins.Repairs, st.BPFPins.Repinned
		}
		if err := enforced("after the repair (" + fault.name + ")"); err != nil {
			t.Error(err)
		}
	}
	if v, err := strconv.Atoi(metric(t, ap.Socket, `membrane_datapath_pin_repairs_total{result="repaired"}`)); err != nil || v < len(faults) || v > repairsBefore {
		t.Errorf(`membrane_datapath_pin_repairs_total{result="repaired"} = %d (%v), want %d to %d (the status's repairs)`, v, err, len(faults), repairsBefore)
	}

	// A new pod: added and enforced (not allowed into srv).
	late := n.AddPod("late")
	if err := testutil.Exchange(late.NS, srv.IPv4, 80, time.Second); err == nil {
		t.Error("a pod added after the repair reached srv; its policy denies it")
	}
	want := endpointSnapshot(t, c)
	delete(want, late.RT.ContainerID)
	if fmt.Sprint(want) != fmt.Sprint(before) {
		t.Errorf("endpoints after the repairs:\n%v\nwant:\n%v", want, before)
	}

	// A restart adopts the re-pinned maps.
	want = endpointSnapshot(t, c)
	ap.Kill()
	ap.Start()
	if id := pinnedMapID(t, ipcache); id != ipcacheID {
		t.Errorf("after a restart the ipcache pin holds map %d, want the re-pinned map %d", id, ipcacheID)
	}
	testutil.EventuallyErr(t, "every endpoint back ready", func() error {
		eps, err := c.EndpointList(ctx, nil)
		if err != nil {
			return err
		}
		for _, ep := range eps {
			if ep.State != "ready" {
				return fmt.Errorf("endpoint %d %s", ep.ID, ep.State)
			}
		}
		return nil
	})
	if got := endpointSnapshot(t, c); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("endpoints after SIGKILL and restart:\n%v\nwant:\n%v", got, want)
	}
	if err := enforced("after the restart"); err != nil {
		t.Error(err)
	}
	if err := testutil.Exchange(late.NS, srv.IPv4, 80, time.Second); err == nil {
		t.Error("after the restart the late pod reached srv")
	}
}

// pinTree lists the pins under dir (relative paths, sorted), without the
// kernel's own files at the root.
func pinTree(t *testing.T, dir string) []string {
	t.Helper()
	var pins []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || strings.HasSuffix(d.Name(), ".debug") {
			return nil
		}
		rel, _ := filepath.Rel(dir, path)
		pins = append(pins, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pins
}

// pinFileID names a pin file: its bpffs instance and inode. A pin
// removed and made again is another file (bpffs numbers inodes from the
// kernel's counter, get_next_ino), and so is one on a fresh bpffs.
type pinFileID struct{ dev, ino uint64 }

func pinFileErr(path string) (pinFileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return pinFileID{}, err
	}
	return pinFileID{dev: st.Dev, ino: st.Ino}, nil
}

func pinFile(t *testing.T, path string) pinFileID {
	t.Helper()
	f, err := pinFileErr(path)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// pinnedMapID is the kernel ID of the map pinned at path.
func pinnedMapID(t *testing.T, path string) ebpf.MapID {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatalf("open pinned map: %v", err)
	}
	defer m.Close()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, ok := info.ID()
	if !ok {
		t.Fatal("map ID unknown")
	}
	return id
}

// removeAllUnder removes everything under dir (the node's own bpffs)
// but the kernel's own files at a bpffs's root (maps.debug, progs.debug:
// the preloaded iterators, which cannot be removed) and the entries
// named in keep.
func removeAllUnder(t *testing.T, dir string, keep ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".debug") || slices.Contains(keep, e.Name()) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
}

// remountBPFFS unmounts the node's own bpffs at dir (its pins go with
// it) and mounts a fresh, empty one there; the harness's cleanup
// unmounts that one.
func remountBPFFS(t *testing.T, dir string) {
	t.Helper()
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
		t.Fatalf("unmount bpffs %s: %v", dir, err)
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, ""); err != nil {
		t.Fatalf("mount a fresh bpffs at %s: %v", dir, err)
	}
}

// eventLog collects the agent's events of one type.
type eventLog struct {
	mu  chan struct{} // a one-slot lock
	got []events.Event
}

// watchEvents streams the agent's events of type typ for the test, from
// the agent's first event on (since=1: the stream may connect after the
// fault it waits for was repaired; it did once, under load).
func watchEvents(t *testing.T, c *client.Client, typ events.Type) *eventLog {
	t.Helper()
	el := &eventLog{mu: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		_ = c.Events(ctx, map[string][]string{"type": {string(typ)}, "since": {"1"}}, func(ev events.Event) bool {
			if ev.Type == typ {
				el.mu <- struct{}{}
				el.got = append(el.got, ev)
				<-el.mu
			}
			return true
		})
	}()
	return el
}

// wait waits until n events match.
func (el *eventLog) wait(t *testing.T, match func(events.Event) bool, n int) {
	t.Helper()
	testutil.EventuallyErr(t, fmt.Sprintf("%d matching events", n), func() error {
		el.mu <- struct{}{}
		defer func() { <-el.mu }()
		k := 0
		for _, ev := range el.got {
			if match(ev) {
				k++
			}
		}
		if k < n {
			return fmt.Errorf("%d of %d: %+v", k, n, el.got)
		}
		return nil
	})
}
