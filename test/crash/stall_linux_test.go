package crash

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/cni"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

// stallLength is how long TestAgentStalled keeps the agent stopped at
// least (the checks made during the stall may make it longer). The
// issue's fault is 60 s; the test uses less to stay in `make test`, and
// MEMBRANE_STALL_SECONDS sets it (run by hand at 60).
const stallLength = 10 * time.Second

// stallAgentTimeout is the plugin's agentTimeout in TestAgentStalled's
// conflist: shorter than the stall, so ADD and DEL meet the timeout.
const stallAgentTimeout = "3s"

// probeTimeout is the DaemonSet's livenessProbe: membranectl's --timeout
// inside kubelet's timeoutSeconds (deploy/helm templates/membrane.yaml).
const probeTimeout = "4s"

// TestAgentStalled: the agent process (linux datapath) is stopped with
// SIGSTOP while pods run with a policy. During the stall an ADD through
// the plugin fails within agentTimeout with code 100 naming the
// unreachable agent, a DEL succeeds by queueing on disk, the liveness
// probe's command fails within its timeout, and the kernel keeps
// enforcing the policy (the allowed pod connects, the denied one does
// not). After SIGCONT the queued DEL is done (endpoint, address and veth
// gone), a new ADD works, the other endpoints, their addresses and
// identities are those of before, and the probe passes.
func TestAgentStalled(t *testing.T) {
	stall := stallLength
	if s := os.Getenv("MEMBRANE_STALL_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("MEMBRANE_STALL_SECONDS=%q: want seconds", s)
		}
		stall = time.Duration(n) * time.Second
	}
	n := nodeharness.New(t, nodeharness.Options{Prefix: "mbc-stall", IPv4Range: "10.249.0.0/24", Network: "crash-stall",
		MTU: 1400, OwnBPFFS: true, AgentTimeout: stallAgentTimeout})
	ap := &agentProc{Node: n, Proc: n.Process("--teardown-delay", "100ms")}
	ap.Start()
	c := client.New(ap.Socket)
	ctx := context.Background()
	checkHealth(t, c, ap.NS, "")

	srv, allowed, denied := n.AddPod("srv"), n.AddPod("allowed"), n.AddPod("denied")
	victim := n.NewPod("victim")
	n.MustAdd(victim)
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
	enforced := func(when string) error {
		if err := testutil.Exchange(allowed.NS, srv.IPv4, 80, 5*time.Second); err != nil {
			return fmt.Errorf("%s: allowed pod to srv: %v", when, err)
		}
		if err := testutil.Exchange(denied.NS, srv.IPv4, 80, time.Second); err == nil {
			return fmt.Errorf("%s: denied pod reached srv", when)
		}
		return nil
	}
	testutil.EventuallyErr(t, "policy enforced before the stall", func() error { return enforced("before") })
	before := endpointSnapshot(t, c)

	// SIGSTOP the agent; whatever happens, it gets SIGCONT before the
	// harness stops it (cleanups run last-in first-out).
	pid := ap.Pid()
	stopped := false
	cont := func() {
		if stopped {
			stopped = false
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT agent %d: %v", pid, err)
			}
		}
	}
	t.Cleanup(cont)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP agent %d: %v", pid, err)
	}
	stopped = true
	stallStart := time.Now()
	t.Logf("agent %d stopped for at least %v (plugin agentTimeout %s)", pid, stall, stallAgentTimeout)

	// ADD: fails with the agent named, within agentTimeout (each call
	// returns while the agent is stopped: SIGCONT comes after them).
	late := n.NewPod("late")
	start := time.Now()
	_, err := n.Add(late)
	t.Logf("ADD during the stall: %v after %v", err, time.Since(start).Round(time.Millisecond))
	if err == nil {
		t.Fatal("ADD succeeded with the agent stopped")
	}
	if code := nodeharness.Code(err); code != 100 || !strings.Contains(err.Error(), "agent unreachable") || !strings.Contains(err.Error(), "agentTimeout") {
		t.Errorf("ADD during the stall: code %d, %v; want 100 naming the unreachable agent and agentTimeout", code, err)
	}

	// DEL: queued on disk, success.
	start = time.Now()
	if err := n.Del(victim); err != nil {
		t.Errorf("DEL during the stall: %v", err)
	}
	t.Logf("DEL during the stall: queued after %v", time.Since(start).Round(time.Millisecond))
	if q := queued(t, n.DeleteQueue); len(q) != 1 {
		t.Errorf("delete queue during the stall: %v, want one entry", q)
	}

	// The liveness probe's command fails within its timeout.
	start = time.Now()
	out, err := exec.Command(nodeharness.Bin("membranectl"), "--socket", ap.Socket, "--timeout", probeTimeout, "status").CombinedOutput()
	t.Logf("liveness probe during the stall: %v after %v: %s", err, time.Since(start).Round(time.Millisecond), out)
	if err == nil {
		t.Errorf("liveness probe passed with the agent stopped: %s", out)
	}

	// The kernel enforces the policy with no agent running.
	if err := enforced("during the stall"); err != nil {
		t.Error(err)
	}
	if left := stall - time.Since(stallStart); left > 0 {
		time.Sleep(left)
	}
	cont()
	t.Logf("agent continued after %v", time.Since(stallStart).Round(time.Millisecond))

	// Convergence: the queue drained, the victim gone, the late pod's
	// ADD retried (after the DEL a runtime makes for a failed ADD).
	testutil.EventuallyErr(t, "the delete queue drained", func() error {
		if q := queued(t, n.DeleteQueue); len(q) != 0 {
			return fmt.Errorf("queued: %v", q)
		}
		return nil
	})
	if err := victim.NS.Remove(); err != nil {
		t.Errorf("remove victim netns: %v", err)
	}
	if err := n.Del(late); err != nil {
		t.Errorf("DEL after the failed ADD: %v", err)
	}
	n.MustAdd(late)
	n.DelAtCleanup(late)
	after := endpointSnapshot(t, c)
	delete(after, late.RT.ContainerID)
	wantAfter := maps.Clone(before)
	delete(wantAfter, victim.RT.ContainerID)
	if fmt.Sprint(after) != fmt.Sprint(wantAfter) {
		t.Errorf("endpoints after the stall:\n%v\nwant (before, without the deleted one):\n%v", after, wantAfter)
	}
	alloc := allocated(t, c)
	if slices.Contains(alloc, victim.IPv4.String()) {
		t.Errorf("the deleted pod's address %s is still allocated: %v", victim.IPv4, alloc)
	}
	nl := ap.NS.Netlink(t)
	victimVeth, _ := cni.VethNames(victim.RT.ContainerID, victim.RT.IfName)
	testutil.EventuallyErr(t, "the deleted pod's veth gone, the others there", func() error {
		eps, err := c.EndpointList(ctx, nil)
		if err != nil {
			return err
		}
		links, err := nl.LinkList()
		if err != nil {
			return err
		}
		var lxc int
		for _, l := range links {
			if l.Attrs().Name == victimVeth {
				return fmt.Errorf("%s still there", victimVeth)
			}
			if strings.HasPrefix(l.Attrs().Name, "lxc") {
				lxc++
			}
		}
		if lxc != len(eps) {
			return fmt.Errorf("%d lxc veths, %d endpoints", lxc, len(eps))
		}
		return nil
	})
	if err := enforced("after the stall"); err != nil {
		t.Error(err)
	}
	checkHealth(t, c, ap.NS, "")
	if out, err := exec.Command(nodeharness.Bin("membranectl"), "--socket", ap.Socket, "--timeout", probeTimeout, "status").CombinedOutput(); err != nil {
		t.Errorf("liveness probe after the stall: %v: %s", err, out)
	}
}

// endpointSnapshot maps each pod endpoint's container ID to its ID,
// addresses and identity.
func endpointSnapshot(t *testing.T, c *client.Client) map[string]string {
	t.Helper()
	eps, err := c.EndpointList(context.Background(), nil)
	if err != nil {
		t.Fatalf("endpoint list: %v", err)
	}
	m := map[string]string{}
	for _, ep := range eps {
		if ep.ContainerID == "" {
			continue
		}
		var addrs models.AddressPair
		if ep.Addressing != nil {
			addrs = *ep.Addressing
		}
		var id int64
		if ep.Identity != nil {
			id = ep.Identity.ID
		}
		m[ep.ContainerID] = fmt.Sprintf("endpoint %d %s %s identity %d", ep.ID, addrs.IPv4, addrs.IPv6, id)
	}
	return m
}

// allocated lists the addresses the agent's IPAM has allocated.
func allocated(t *testing.T, c *client.Client) []string {
	t.Helper()
	st, err := c.IPAMStatus(context.Background())
	if err != nil {
		t.Fatalf("ipam: %v", err)
	}
	var ips []string
	if st.IPv4 != nil {
		for _, a := range st.IPv4.Allocations {
			ips = append(ips, a.IP)
		}
	}
	return ips
}

// queued lists the delete queue's entries.
func queued(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatalf("read delete queue: %v", err)
	}
	var names []string
	for _, e := range ents {
		if !e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	return names
}

// starveQuota is TestAgentCPUStarved's CPU limit: 5 ms per 100 ms
// period (5% of one CPU), as the issue asks.
const starveQuota, starvePeriod = 5000, 100000

// starveAgentTimeout is the plugin's agentTimeout in TestAgentCPUStarved.
// Short, with starveBurst concurrent ADDs, so that some may meet it.
const starveAgentTimeout = "2s"

// starveBurst is how many ADDs TestAgentCPUStarved makes at once while
// the agent is starved.
const starveBurst = 8

// TestAgentCPUStarved: the agent process (linux datapath) is moved into
// a cgroup of its own limited to 5% of a CPU (cgroup v2 cpu.max where
// the unified hierarchy has the cpu controller, else v1
// cpu.cfs_quota_us). While starved, an ADD through the plugin either
// succeeds or fails with 100 naming the agent, within agentTimeout; a
// DEL succeeds (done or queued). After the limit is lifted everything
// converges: the queue drains, the deleted pod's endpoint and address
// are gone, the other endpoints are unchanged, a new ADD works and the
// probe passes.
func TestAgentCPUStarved(t *testing.T) {
	n := nodeharness.New(t, nodeharness.Options{Prefix: "mbc-starve", IPv4Range: "10.248.0.0/24", Network: "crash-starve",
		MTU: 1400, OwnBPFFS: true, AgentTimeout: starveAgentTimeout})
	ap := &agentProc{Node: n, Proc: n.Process("--teardown-delay", "100ms")}
	ap.Start()
	c := client.New(ap.Socket)
	checkHealth(t, c, ap.NS, "")
	n.AddPod("keep")
	victim := n.NewPod("victim")
	n.MustAdd(victim)
	before := endpointSnapshot(t, c)

	unlimit := limitCPU(t, ap.Pid())
	t.Logf("agent %d limited to %d/%d us of CPU", ap.Pid(), starveQuota, starvePeriod)
	late := make([]*nodeharness.Pod, starveBurst)
	addErrs := make([]error, starveBurst)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range late {
		late[i] = n.NewPod(fmt.Sprintf("late-%d", i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, addErrs[i] = n.Add(late[i])
		}()
	}
	wg.Wait()
	failed := 0
	for i, err := range addErrs {
		if err == nil {
			continue
		}
		failed++
		if nodeharness.Code(err) != 100 || !strings.Contains(err.Error(), "agent unreachable") {
			t.Errorf("ADD %d while starved: code %d, %v; want success or 100 naming the unreachable agent", i, nodeharness.Code(err), err)
		}
	}
	t.Logf("%d ADDs at once while starved: %d failed (agentTimeout %s), all done after %v; first error: %v", starveBurst, failed,
		starveAgentTimeout, time.Since(start).Round(time.Millisecond), errors.Join(addErrs...))
	start = time.Now()
	if err := n.Del(victim); err != nil {
		t.Errorf("DEL while starved: %v", err)
	}
	t.Logf("DEL while starved: done after %v, %d queued", time.Since(start).Round(time.Millisecond), len(queued(t, n.DeleteQueue)))
	start = time.Now()
	out, err := exec.Command(nodeharness.Bin("membranectl"), "--socket", ap.Socket, "--timeout", probeTimeout, "status").CombinedOutput()
	t.Logf("liveness probe while starved: %v after %v", err, time.Since(start).Round(time.Millisecond))
	if err != nil && !strings.Contains(string(out), "deadline exceeded") {
		t.Errorf("liveness probe while starved failed otherwise than by its timeout: %v: %s", err, out)
	}
	if st, err := os.ReadFile(cgroupOf(t, ap.Pid()) + "/cpu.stat"); err == nil {
		t.Logf("agent's cgroup while starved: %s", strings.Join(strings.Fields(string(st)), " "))
	}
	unlimit()

	testutil.EventuallyErr(t, "the delete queue drained", func() error {
		if q := queued(t, n.DeleteQueue); len(q) != 0 {
			return fmt.Errorf("queued: %v", q)
		}
		return nil
	})
	if err := victim.NS.Remove(); err != nil {
		t.Errorf("remove victim netns: %v", err)
	}
	for i, p := range late {
		if addErrs[i] != nil {
			// The runtime's DEL after a failed ADD, then its retry.
			if err := n.Del(p); err != nil {
				t.Errorf("DEL after the failed ADD: %v", err)
			}
			n.MustAdd(p)
		}
		n.DelAtCleanup(p)
	}
	after := endpointSnapshot(t, c)
	for _, p := range late {
		if _, ok := after[p.RT.ContainerID]; !ok {
			t.Errorf("no endpoint for %s: %v", p, after)
		}
		delete(after, p.RT.ContainerID)
	}
	want := maps.Clone(before)
	delete(want, victim.RT.ContainerID)
	if fmt.Sprint(after) != fmt.Sprint(want) {
		t.Errorf("endpoints after starvation:\n%v\nwant:\n%v", after, want)
	}
	if alloc := allocated(t, c); slices.Contains(alloc, victim.IPv4.String()) {
		t.Errorf("the deleted pod's address %s is still allocated: %v", victim.IPv4, alloc)
	}
	checkHealth(t, c, ap.NS, "")
	if out, err := exec.Command(nodeharness.Bin("membranectl"), "--socket", ap.Socket, "--timeout", probeTimeout, "status").CombinedOutput(); err != nil {
		t.Errorf("liveness probe after starvation: %v: %s", err, out)
	}
}

// limitCPU moves pid (the test's own agent) into a new cgroup limited to
// starveQuota per starvePeriod and returns the function that moves it
// back to its cgroup and removes the new one (also run at cleanup).
func limitCPU(t *testing.T, pid int) func() {
	t.Helper()
	name := "membrane-test-starve-" + testutil.RandomSuffix(8)
	var root, limit, val string
	if ctrl, err := os.ReadFile("/sys/fs/cgroup/cgroup.subtree_control"); err == nil && slices.Contains(strings.Fields(string(ctrl)), "cpu") {
		root, limit, val = "/sys/fs/cgroup", "cpu.max", fmt.Sprintf("%d %d", starveQuota, starvePeriod)
	} else if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"); err == nil {
		root, limit, val = "/sys/fs/cgroup/cpu", "cpu.cfs_quota_us", strconv.Itoa(starveQuota)
	} else if testutil.InCI() {
		t.Fatal("no cgroup cpu controller (v2 cpu.max or v1 cpu.cfs_quota_us) and CI is set")
	} else {
		t.Skip("no cgroup cpu controller")
	}
	// The agent's own cgroup in that hierarchy, to move it back to.
	orig := root
	self, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(self)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && ((limit == "cpu.max" && parts[0] == "0") || slices.Contains(strings.Split(parts[1], ","), "cpu")) {
			orig = root + parts[2]
		}
	}
	dir := orig + "/" + name
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("cgroup: %v", err)
	}
	done := false
	undo := func() {
		if done {
			return
		}
		done = true
		if err := os.WriteFile(orig+"/cgroup.procs", []byte(strconv.Itoa(pid)), 0); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Errorf("move agent back to %s: %v", orig, err)
		}
		if err := os.Remove(dir); err != nil {
			t.Errorf("remove cgroup %s: %v", dir, err)
		}
	}
	t.Cleanup(undo)
	if limit == "cpu.cfs_quota_us" {
		if err := os.WriteFile(dir+"/cpu.cfs_period_us", []byte(strconv.Itoa(starvePeriod)), 0); err != nil {
			t.Fatalf("cgroup period: %v", err)
		}
	}
	if err := os.WriteFile(dir+"/"+limit, []byte(val), 0); err != nil {
		t.Fatalf("cgroup %s: %v", limit, err)
	}
	// cgroup.procs moves every thread of the process (v1 and v2).
	if err := os.WriteFile(dir+"/cgroup.procs", []byte(strconv.Itoa(pid)), 0); err != nil {
		t.Fatalf("move agent into %s: %v", dir, err)
	}
	return undo
}

// cgroupOf is the directory of pid's cpu cgroup (v1 or v2).
func cgroupOf(t *testing.T, pid int) string {
	t.Helper()
	self, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	v2 := ""
	for _, line := range strings.Split(strings.TrimSpace(string(self)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if slices.Contains(strings.Split(parts[1], ","), "cpu") {
			return "/sys/fs/cgroup/cpu" + parts[2]
		}
		if parts[0] == "0" {
			v2 = "/sys/fs/cgroup" + parts[2]
		}
	}
	return v2
}
