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
