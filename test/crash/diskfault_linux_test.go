package crash

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/cni"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

// stateDevice is the test's own block device under a node's state
// directory, built so that its faults can be injected and ended:
// a tmpfs (the test's) holds outer.img, a loop device over it carries an
// ext4 that holds state.img, and a second loop device over state.img
// carries the ext4 (no journal) mounted at the state directory.
//
// This kernel has no device-mapper and no fault injection
// (CONFIG_FAULT_INJECTION unset), so an I/O error is made one layer
// down: making state.img immutable (chattr +i) makes the inner loop
// device's writes fail (the outer ext4 refuses writes to an immutable
// file, and the loop driver turns that into EIO), so the state
// directory's writes and fdatasyncs fail with EIO; chattr -i ends it.
// (A tmpfs ignores the immutable flag for the loop driver's writes,
// hence the outer ext4.) Read-only is the state ext4's own error
// handling (errors=remount-ro, triggered through its sysfs
// trigger_fs_error): a plain `mount -o remount,ro` is refused with EBUSY
// while the agent holds its journal open for writing, so a read-only
// state directory meets a running agent only this way.
type stateDevice struct {
	t                 *testing.T
	ns                *mountNS
	dir, mnt          string // the test's tmpfs; where the state ext4 is mounted (paths in ns)
	outerLoop, loop   string // /dev/loopN
	outerMnt, image   string // the outer ext4's mount; state.img (paths in ns)
	errorsMode        string // the state ext4's errors= option
	mounted, outerOn  bool
	outerAttached, on bool
}

// newStateDevice builds the stack under mnt (the node's state
// directory, which must not exist yet or be empty); cleanup removes it.
//
// Every mount of the stack lives in a mount namespace of the test's own
// (mountNS), never in the machine's: a process elsewhere that makes a
// mount namespace while the stack is mounted (a container runtime, a
// parallel test's `unshare -m`) would otherwise hold a copy of the state
// ext4 and keep its superblock alive, so the operator's fsck finds the
// device in use. The agent reaches the directory through
// /proc/<holder>/root (View).
func newStateDevice(t *testing.T, base, mnt, errorsMode string) *stateDevice {
	t.Helper()
	ns := newMountNS(t)
	sd := &stateDevice{t: t, ns: ns, dir: filepath.Join(base, "statedev"), mnt: mnt, errorsMode: errorsMode}
	if err := os.MkdirAll(sd.dir, 0o750); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sd.cleanup)
	ns.must("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0750", 96<<20), "tmpfs", sd.dir)
	outer := filepath.Join(sd.dir, "outer.img")
	run(t, "truncate", "-s", "80M", ns.path(outer))
	run(t, "mkfs.ext4", "-q", "-F", ns.path(outer))
	sd.outerLoop = strings.TrimSpace(run(t, "losetup", "-f", "--show", ns.path(outer)))
	sd.outerAttached = true
	sd.outerMnt = filepath.Join(sd.dir, "outer")
	if err := os.MkdirAll(ns.path(sd.outerMnt), 0o700); err != nil {
		t.Fatal(err)
	}
	ns.must("mount", "-t", "ext4", sd.outerLoop, sd.outerMnt)
	sd.outerOn = true
	sd.image = filepath.Join(sd.outerMnt, "state.img")
	run(t, "truncate", "-s", "48M", ns.path(sd.image))
	run(t, "mkfs.ext4", "-q", "-F", "-O", "^has_journal", ns.path(sd.image))
	sd.loop = strings.TrimSpace(run(t, "losetup", "-f", "--show", ns.path(sd.image)))
	sd.on = true
	sd.mount()
	return sd
}

// View is the state directory as every other process reaches it: through
// the holder's root.
func (sd *stateDevice) View() string { return sd.ns.path(sd.mnt) }

func (sd *stateDevice) mount() {
	sd.t.Helper()
	if err := os.MkdirAll(sd.ns.path(sd.mnt), 0o750); err != nil {
		sd.t.Fatal(err)
	}
	sd.ns.must("mount", "-t", "ext4", "-o", "errors="+sd.errorsMode, sd.loop, sd.mnt)
	sd.mounted = true
}

// failIO makes every write and flush of the state directory fail with
// EIO; healIO ends it.
func (sd *stateDevice) failIO()         { run(sd.t, "chattr", "+i", sd.ns.path(sd.image)) }
func (sd *stateDevice) healIO()         { run(sd.t, "chattr", "-i", sd.ns.path(sd.image)) }
func (sd *stateDevice) devName() string { return filepath.Base(sd.loop) }

// readOnly has the state ext4 report an error: with errors=remount-ro
// the kernel turns it read-only (EROFS for every write, flush and
// create), as after a real metadata error.
func (sd *stateDevice) readOnly() {
	sd.t.Helper()
	path := filepath.Join("/sys/fs/ext4", sd.devName(), "trigger_fs_error")
	if err := os.WriteFile(path, []byte("membrane test: state disk fault\n"), 0o200); err != nil {
		sd.t.Fatalf("trigger ext4 error: %v", err)
	}
}

// repair is the operator's repair of a filesystem the kernel made
// read-only: unmount (the agent holds nothing there), fsck, mount again.
func (sd *stateDevice) repair() {
	sd.t.Helper()
	sd.ns.must("umount", sd.mnt)
	sd.mounted = false
	out, err := exec.Command("e2fsck", "-f", "-y", sd.loop).CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) { // 1: errors corrected
		sd.t.Fatalf("e2fsck: %v\n%s%s", err, out, holdersOf(sd.loop))
	}
	sd.mount()
}

func (sd *stateDevice) cleanup() {
	if sd.mounted {
		_ = exec.Command("chattr", "-i", sd.ns.path(sd.image)).Run()
		if out, err := sd.ns.run("umount", "-l", sd.mnt); err != nil {
			sd.t.Errorf("unmount %s: %v %s", sd.mnt, err, out)
		}
	}
	if sd.on {
		if out, err := exec.Command("losetup", "-d", sd.loop).CombinedOutput(); err != nil {
			sd.t.Errorf("losetup -d %s: %v %s", sd.loop, err, out)
		}
	}
	if sd.outerOn {
		if out, err := sd.ns.run("umount", "-l", sd.outerMnt); err != nil {
			sd.t.Errorf("unmount %s: %v %s", sd.outerMnt, err, out)
		}
	}
	if sd.outerAttached {
		if out, err := exec.Command("losetup", "-d", sd.outerLoop).CombinedOutput(); err != nil {
			sd.t.Errorf("losetup -d %s: %v %s", sd.outerLoop, err, out)
		}
	}
	if out, err := sd.ns.run("umount", "-l", sd.dir); err != nil {
		sd.t.Errorf("unmount %s: %v %s", sd.dir, err, out)
	}
}

// mountNS is a mount namespace of the test's own: a holder process in
// `unshare -m --propagation slave` (the machine's unmounts still reach
// its copies; its own mounts never reach the machine), killed at
// cleanup, which frees whatever is still mounted in it.
type mountNS struct {
	t   *testing.T
	pid int
}

func newMountNS(t *testing.T) *mountNS {
	t.Helper()
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Fatalf("nsenter (util-linux) is needed: %v", err)
	}
	pid := testutil.StartMountNSHolder(t, "slave", "echo ready && exec sleep 3600")
	self, err1 := os.Readlink("/proc/self/ns/mnt")
	its, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err1 != nil || err2 != nil || self == its {
		t.Fatalf("the holder's mount namespace %q (%v), ours %q (%v): want a new one", its, err2, self, err1)
	}
	return &mountNS{t: t, pid: pid}
}

// path is p (absolute, in the namespace) as seen from any other process.
func (m *mountNS) path(p string) string { return fmt.Sprintf("/proc/%d/root%s", m.pid, p) }

// run runs a command in the namespace (nsenter -m).
func (m *mountNS) run(args ...string) ([]byte, error) {
	return exec.Command("nsenter", append([]string{"-t", strconv.Itoa(m.pid), "-m", "--"}, args...)...).CombinedOutput()
}

func (m *mountNS) must(args ...string) {
	m.t.Helper()
	if out, err := m.run(args...); err != nil {
		m.t.Fatalf("in the test's mount namespace: %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// holdersOf names the processes whose mount namespaces mount dev (an
// e2fsck refused for "in use" says who).
func holdersOf(dev string) string {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return ""
	}
	want := fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	procs, _ := filepath.Glob("/proc/[0-9]*/mountinfo")
	seen := map[string]bool{}
	var holders []string
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(data), "\n") {
			if f := strings.Fields(line); len(f) > 4 && f[2] == want {
				pid := filepath.Base(filepath.Dir(p))
				ns, _ := os.Readlink(filepath.Join("/proc", pid, "ns", "mnt"))
				if !seen[ns] {
					seen[ns] = true
					comm, _ := os.ReadFile(filepath.Join("/proc", pid, "comm"))
					holders = append(holders, fmt.Sprintf("pid %s (%s) %s at %s", pid, strings.TrimSpace(string(comm)), ns, f[4]))
				}
				break
			}
		}
	}
	if len(holders) == 0 {
		return "no mount namespace mounts " + dev
	}
	return dev + " is mounted in: " + strings.Join(holders, "; ")
}

// run runs a command, failing the test on an error; returns its output.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// diskFault is one state-disk fault of TestStateDiskFaults.
type diskFault struct {
	name       string
	cidr       string
	errorsMode string // the state ext4's errors=
	// code is the API's error code for a create, cause the status's,
	// errno what the CNI error names.
	code, cause, errno string
	inject             func(sd *stateDevice)
	// live: the fault ends under the running agent (healIO), which
	// recovers by itself; otherwise the agent is killed and the
	// filesystem repaired (repair) before it starts again.
	live bool
}

// TestStateDiskFaults: the state directory fails under a running agent
// (linux datapath, pods on veths with a policy) with EIO (every write and
// flush) or turns read-only (EROFS). Meanwhile creates are refused
// through the API (507 naming the cause) and through the plugin (CNI
// code 108 naming the cause), nothing is acknowledged that is not
// durable, GET /v1/status, a state-dir-health event and the
// membrane_state_dir_healthy metric say the directory is unhealthy and
// why, the existing pods keep talking and the policy stays enforced, and
// a DEL through the plugin succeeds: the endpoint leaves the kernel and
// the agent at once, its state record is removed when the disk works
// again (the DEL is queued for the agent too). An I/O fault ends under
// the running agent, which recovers by itself (status, event, metric,
// the deleted endpoint's state removed, a new ADD works); a read-only
// filesystem needs the operator's unmount, fsck and mount, with the
// agent killed (SIGKILL) meanwhile. Then a SIGKILL and restart restore
// exactly the endpoints that were acknowledged.
func TestStateDiskFaults(t *testing.T) {
	testutil.RequireRoot(t)
	for _, f := range []diskFault{
		{name: "io-error", cidr: "10.247.0.0/24", errorsMode: "continue", code: "state-disk-io-error", cause: "io-error", errno: "EIO",
			inject: (*stateDevice).failIO, live: true},
		{name: "read-only", cidr: "10.246.0.0/24", errorsMode: "remount-ro", code: "state-dir-read-only", cause: "read-only", errno: "EROFS",
			inject: (*stateDevice).readOnly},
	} {
		t.Run(f.name, func(t *testing.T) { testDiskFault(t, f) })
	}
}

func testDiskFault(t *testing.T, f diskFault) {
	n := nodeharness.New(t, nodeharness.Options{Prefix: "mbc-disk", IPv4Range: f.cidr, Network: "crash-disk-" + f.name,
		MTU: 1400, OwnBPFFS: true})
	sd := newStateDevice(t, n.Dir, n.StateDir, f.errorsMode)
	n.StateDir = sd.View()
	// What a parallel test or a container runtime does: a new mount
	// namespace copied from the machine's while the stack is mounted.
	testutil.HoldHostMountNS(t)
	ap := &agentProc{Node: n, Proc: n.Process("--teardown-delay", "100ms", "--enable-health=false")}
	ap.Start()
	c := client.New(ap.Socket)
	defer c.Close()
	ctx := context.Background()

	victim := n.NewPod("victim")
	n.MustAdd(victim)
	_, enforced := policyPods(t, n, c)
	testutil.EventuallyErr(t, "policy enforced before the fault", func() error { return enforced("before") })
	before := endpointSnapshot(t, c)
	stateEvents := watchStateDirEvents(t, c)

	f.inject(sd)
	faultAt := time.Now()

	// A create through the API: refused, naming the cause, nothing left.
	w := newWorld(1)
	api := w.newPod()
	d := &clientDriver{t: t, agent: ap, c: c}
	err := d.add(ctx, api)
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != 507 || ae.Code != f.code {
		t.Fatalf("API create with the state disk failing = %v, want 507 %s", err, f.code)
	}
	t.Logf("API create during the fault: %v", err)
	// An ADD through the plugin: refused with 108 naming the cause;
	// the runtime then runs DEL for the failed ADD.
	late := n.NewPod("late")
	_, err = n.Add(late)
	if code := nodeharness.Code(err); code != cni.CodeStateDisk || !strings.Contains(err.Error(), f.errno) || !strings.Contains(err.Error(), f.code) {
		t.Fatalf("CNI ADD with the state disk failing: code %d, %v; want %d naming %s and %s", code, err, cni.CodeStateDisk, f.errno, f.code)
	}
	t.Logf("CNI ADD during the fault: %v", err)
	if err := n.Del(late); err != nil {
		t.Errorf("DEL after the failed ADD: %v", err)
	}
	after := endpointSnapshot(t, c)
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("endpoints after the refused creates:\n%v\nwant:\n%v", after, before)
	}

	// Said clearly: status, event, metric.
	st, err := c.Status(ctx)
	if err != nil || st.StateDir == nil || st.StateDir.Healthy || st.StateDir.Cause != f.cause || !strings.Contains(st.StateDir.LastError, f.errnoText()) {
		t.Errorf("status during the fault: %+v, %v; want the state dir unhealthy, cause %s", st.StateDir, err, f.cause)
	}
	stateEvents.wait(t, f.cause)
	if v := metric(t, ap.Socket, "membrane_state_dir_healthy"); v != "0" {
		t.Errorf("membrane_state_dir_healthy during the fault = %q, want 0", v)
	}
	if v := metric(t, ap.Socket, `membrane_state_dir_faults_total{cause="`+f.cause+`"}`); v == "" || v == "0" {
		t.Errorf("membrane_state_dir_faults_total{cause=%q} during the fault = %q, want > 0", f.cause, v)
	}

	// The kernel keeps forwarding and enforcing.
	if err := enforced("during the fault"); err != nil {
		t.Error(err)
	}

	// DEL: succeeds; the endpoint leaves the agent and the kernel now.
	victimEp, err := c.EndpointGet(ctx, "container-id:"+victim.RT.ContainerID)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Del(victim); err != nil {
		t.Fatalf("DEL with the state disk failing: %v", err)
	}
	if _, err := c.EndpointGet(ctx, "container-id:"+victim.RT.ContainerID); !client.IsNotFound(err) {
		t.Errorf("victim's endpoint after its DEL: %v, want not found", err)
	}
	victimVeth, _ := cni.VethNames(victim.RT.ContainerID, victim.RT.IfName)
	nl := ap.NS.Netlink(t)
	testutil.EventuallyErr(t, "the victim's veth gone", func() error {
		if _, err := nl.LinkByName(victimVeth); err == nil {
			return fmt.Errorf("%s still there", victimVeth)
		}
		return nil
	})
	if q := queued(t, n.DeleteQueue); len(q) != 1 {
		t.Errorf("delete queue after the DEL: %v, want the DEL queued (its state record could not be removed)", q)
	}
	if err := victim.NS.Remove(); err != nil {
		t.Errorf("remove victim netns: %v", err)
	}
	wantAfter := maps.Clone(before)
	delete(wantAfter, victim.RT.ContainerID)

	// The fault ends.
	if f.live {
		sd.healIO()
	} else {
		// A crash while the filesystem is still read-only: the agent
		// starts on it, degraded, rather than crash-looping, and holds
		// nothing open there, so the operator repairs it under the
		// running agent, which then recovers by itself.
		ap.Kill()
		ap.Start()
		readOnlyStart(t, ap, c, n, wantAfter, enforced)
		sd.repair()
	}
	healedAt := time.Now()
	testutil.EventuallyErr(t, "the state dir healthy again", func() error {
		st, err := c.Status(ctx)
		if err != nil || st.StateDir == nil || !st.StateDir.Healthy {
			return fmt.Errorf("status: %+v, %v", st.StateDir, err)
		}
		return nil
	})
	t.Logf("%s: the fault lasted %v; healthy %v after it ended", f.name, healedAt.Sub(faultAt).Round(time.Millisecond),
		time.Since(healedAt).Round(time.Millisecond))
	if f.live {
		stateEvents.wait(t, "ok")
		if v := metric(t, ap.Socket, "membrane_state_dir_healthy"); v != "1" {
			t.Errorf("membrane_state_dir_healthy after the fault = %q, want 1", v)
		}
	}
	testutil.EventuallyErr(t, "the deleted endpoint's state removed", func() error {
		if persisted(t, ap.StateDir)[int(victimEp.ID)] {
			return fmt.Errorf("endpoint %d still has state", victimEp.ID)
		}
		return nil
	})
	if got := endpointSnapshot(t, c); fmt.Sprint(got) != fmt.Sprint(wantAfter) {
		t.Errorf("endpoints after the fault:\n%v\nwant:\n%v", got, wantAfter)
	}
	n.MustAdd(late)
	n.DelAtCleanup(late)
	if err := enforced("after the fault"); err != nil {
		t.Error(err)
	}

	// An exact restore after SIGKILL.
	wantRestart := endpointSnapshot(t, c)
	ap.Kill()
	ap.Start()
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
	if got := endpointSnapshot(t, c); fmt.Sprint(got) != fmt.Sprint(wantRestart) {
		t.Errorf("endpoints after SIGKILL and restart:\n%v\nwant:\n%v", got, wantRestart)
	}
	checkAddresses(t, ctx, c, ap.StateDir)
	if err := enforced("after the restart"); err != nil {
		t.Error(err)
	}
}

// readOnlyStart checks an agent started on the read-only state
// directory: it restored the endpoints that were acknowledged (the
// victim, deleted, is not: its state is removed once the directory
// works again), says the directory is read-only, refuses creates naming
// the cause and keeps enforcing.
func readOnlyStart(t *testing.T, ap *agentProc, c *client.Client, n *nodeharness.Node, want map[string]string, enforced func(string) error) {
	t.Helper()
	ctx := context.Background()
	testutil.EventuallyErr(t, "endpoints restored on the read-only directory", func() error {
		if got := endpointSnapshot(t, c); fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("endpoints:\n%v\nwant:\n%v", got, want)
		}
		return nil
	})
	st, err := c.Status(ctx)
	if err != nil || st.StateDir == nil || st.StateDir.Healthy || st.StateDir.Cause != "read-only" {
		t.Errorf("status of the agent started on the read-only directory: %+v, %v; want unhealthy, read-only", st.StateDir, err)
	}
	if v := metric(t, ap.Socket, "membrane_state_dir_healthy"); v != "0" {
		t.Errorf("membrane_state_dir_healthy after the read-only start = %q, want 0", v)
	}
	late := n.NewPod("late-ro")
	_, err = n.Add(late)
	if code := nodeharness.Code(err); code != cni.CodeStateDisk || !strings.Contains(err.Error(), "EROFS") {
		t.Errorf("CNI ADD on the read-only start: code %d, %v; want %d naming EROFS", code, err, cni.CodeStateDisk)
	}
	if err := n.Del(late); err != nil {
		t.Errorf("DEL after the failed ADD: %v", err)
	}
	if err := late.NS.Remove(); err != nil {
		t.Errorf("remove netns: %v", err)
	}
	if err := enforced("after the read-only start"); err != nil {
		t.Error(err)
	}
}

// policyPods adds pods srv, allowed and denied on n with a policy
// letting only allowed into srv (an echo server on port 80), and returns
// the check that allowed gets through and denied does not.
func policyPods(t *testing.T, n *nodeharness.Node, c *client.Client) (srv *nodeharness.Pod, enforced func(when string) error) {
	t.Helper()
	ctx := context.Background()
	srv = n.AddPod("srv")
	allowed, denied := n.AddPod("allowed"), n.AddPod("denied")
	for _, p := range []*nodeharness.Pod{srv, allowed} {
		if _, err := c.EndpointPatchLabels(ctx, "container-id:"+p.RT.ContainerID, []string{"k8s:app=" + p.Name}, nil); err != nil {
			t.Fatalf("label %s: %v", p, err)
		}
	}
	doc := `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: srv-in, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: srv}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: allowed}}]
`
	if _, err := c.PolicyImport(ctx, []byte(doc), "application/yaml"); err != nil {
		t.Fatalf("import policy: %v", err)
	}
	testutil.EchoServer(t, srv.NS, srv.IPv4, 80)
	return srv, func(when string) error {
		if err := testutil.Exchange(allowed.NS, srv.IPv4, 80, 5*time.Second); err != nil {
			return fmt.Errorf("%s: allowed pod to srv: %v", when, err)
		}
		if err := testutil.Exchange(denied.NS, srv.IPv4, 80, time.Second); err == nil {
			return fmt.Errorf("%s: denied pod reached srv", when)
		}
		return nil
	}
}

// errnoText is how the kernel's error reads in the status's last error.
func (f diskFault) errnoText() string {
	if f.errno == "EROFS" {
		return "read-only file system"
	}
	return "input/output error"
}

// stateDirEvents collects the agent's state-dir-health events.
type stateDirEvents struct {
	mu  sync.Mutex
	got []string // states, in order
}

func watchStateDirEvents(t *testing.T, c *client.Client) *stateDirEvents {
	t.Helper()
	se := &stateDirEvents{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		_ = c.Events(ctx, map[string][]string{"type": {string(events.StateDirHealth)}}, func(ev events.Event) bool {
			if ev.Type == events.StateDirHealth {
				se.mu.Lock()
				se.got = append(se.got, ev.State)
				se.mu.Unlock()
			}
			return true
		})
	}()
	return se
}

// wait waits for an event with state.
func (se *stateDirEvents) wait(t *testing.T, state string) {
	t.Helper()
	testutil.EventuallyErr(t, "a state-dir-health event "+state, func() error {
		se.mu.Lock()
		defer se.mu.Unlock()
		for _, s := range se.got {
			if s == state {
				return nil
			}
		}
		return fmt.Errorf("events: %v", se.got)
	})
}

// metric is the value of the sample named exactly series in the agent's
// /metrics ("" if absent).
func metric(t *testing.T, socket, series string) string {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}}
	resp, err := hc.Get("http://agent/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
