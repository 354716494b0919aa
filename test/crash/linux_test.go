package crash

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

// cniDriver makes attachments with the real membrane-cni binary through
// libcni, in a netns standing in for the host (where the agent process
// runs too); every pod gets its own netns.
type cniDriver struct {
	t     *testing.T
	agent *agentProc

	mu  sync.Mutex     // guards nss
	nss []*testutil.NS // every pod netns made, removed at cleanup
}

func newCNIDriver(t *testing.T, ap *agentProc) *cniDriver {
	t.Helper()
	d := &cniDriver{t: t, agent: ap}
	t.Cleanup(func() {
		for _, ns := range d.nss {
			// Removed already after a DEL; an error means it leaked.
			if err := ns.Remove(); err != nil {
				t.Errorf("pod netns leaked: %v", err)
			}
		}
	})
	return d
}

func (d *cniDriver) rt(p *pod) *libcni.RuntimeConf {
	return nodeharness.RuntimeConf(p.containerID, p.ns.Path, podNamespace, p.name)
}

// inHost runs fn on a thread in the host netns, so that the plugin
// processes libcni starts run there.
func (d *cniDriver) inHost(fn func() error) error { return d.agent.NS.Do(fn) }

func (d *cniDriver) add(ctx context.Context, p *pod) error {
	ns, err := testutil.CreateNS("mbc-pod-" + testutil.RandomSuffix(8))
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.nss = append(d.nss, ns)
	d.mu.Unlock()
	p.ns = ns
	return d.inHost(func() error {
		_, err := d.agent.AddRT(ctx, d.rt(p))
		return err
	})
}

// del runs DEL, then removes the pod's netns as the runtime does.
func (d *cniDriver) del(ctx context.Context, p *pod) error {
	if err := d.inHost(func() error { return d.agent.DelRT(ctx, d.rt(p)) }); err != nil {
		return err
	}
	return p.ns.Remove()
}

func (d *cniDriver) delDown(p *pod) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.del(ctx, p); err != nil {
		d.t.Fatalf("DEL %s with the agent down: %v", p.name, err)
	}
}

// linuxAgent prepares the agent process on the linux datapath in a new host
// netns, with a real bpffs for its pins.
func linuxAgent(t *testing.T, cidr string, extra ...string) *agentProc {
	t.Helper()
	n := nodeharness.New(t, nodeharness.Options{Prefix: "mbc-host", IPv4Range: cidr, Network: "crash-linux", MTU: 1400, OwnBPFFS: true})
	ap := &agentProc{Node: n, Proc: n.Process(append([]string{"--teardown-delay", "100ms"}, extra...)...)}
	return ap
}

// TestCrashLinux: the agent (linux datapath, in a test netns) is killed
// with SIGKILL during a churn of CNI ADDs and DELs made by the real
// plugin; DELs are made while it is down; an orphan veth and orphan pin
// directories appear. After each restart the invariants of TestCrashFake
// hold and, after the garbage collector's passes, the host's lxc veths
// are exactly the endpoints' and the pin directories only live ones.
func TestCrashLinux(t *testing.T) {
	// The interval must exceed the longest ADD, even on a loaded CI machine.
	ap := linuxAgent(t, "10.252.0.0/24", "--gc-interval", "1s")
	ap.Start()
	d := newCNIDriver(t, ap)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	w := newWorld(seed)
	nl := ap.NS.Netlink(t)
	iterations := 3
	healthIP := checkHealth(t, client.New(ap.Socket), ap.NS, "")
	for i := range iterations {
		ctx, cancel := context.WithCancel(context.Background())
		wg := w.churn(ctx, d, 3)
		time.Sleep(time.Duration(300+w.intN(900)) * time.Millisecond)
		ap.Kill()
		cancel()
		wg.Wait()
		for range 1 + w.intN(2) {
			if p := w.pickLive(podQueued); p != nil {
				d.delDown(p)
			}
		}
		orphan := "lxc" + testutil.RandomSuffix(12) // an ADD killed before it could roll back
		attrs := netlink.NewLinkAttrs()
		attrs.Name = orphan
		if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "tmp" + orphan[3:]}); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"60001", strconv.Itoa(1000 + i)} {
			if err := os.MkdirAll(filepath.Join(ap.BPFFS, "endpoints", id), 0o700); err != nil {
				t.Fatal(err)
			}
		}
		before := persisted(t, ap.StateDir)
		ap.Start()
		c := client.New(ap.Socket)
		checkRestart(t, c, w, ap.StateDir, before)
		checkNoOrphans(t, c, nl, ap.BPFFS)
		healthIP = checkHealth(t, c, ap.NS, healthIP)
		t.Logf("iteration %d: %s", i, w.summary())
		c.Close()
		if t.Failed() {
			return
		}
	}
}

// checkNoOrphans waits until the host's lxc veths are exactly the
// endpoints' interfaces and <bpffs>/endpoints holds only live IDs (the
// garbage collector needs two passes; deleted endpoints' veths go after
// the teardown delay).
func checkNoOrphans(t *testing.T, c *client.Client, nl *netlink.Handle, bpffs string) {
	t.Helper()
	testutil.EventuallyErr(t, "no orphans after GC", func() error {
		eps, err := c.EndpointList(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		live := map[string]bool{}
		var veths, want, pins []string
		for _, ep := range eps {
			if ep.InterfaceName != "" {
				want = append(want, ep.InterfaceName)
			}
			live[strconv.Itoa(int(ep.ID))] = true
		}
		links, err := nl.LinkList()
		if errors.Is(err, netlink.ErrDumpInterrupted) {
			return err // links changed under the dump (the GC at work): partial, take it again
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Name, "lxc") {
				veths = append(veths, l.Attrs().Name)
			}
		}
		entries, _ := os.ReadDir(filepath.Join(bpffs, "endpoints"))
		for _, e := range entries {
			if !live[e.Name()] {
				pins = append(pins, e.Name())
			}
		}
		sort.Strings(veths)
		sort.Strings(want)
		if slices.Equal(veths, want) && len(pins) == 0 {
			return nil
		}
		return fmt.Errorf("lxc veths %v, endpoints' %v, orphan pins %v", veths, want, pins)
	})
}

// checkHealth: the health endpoint answers its probe and ping from the
// host netns, on the address it had before the restart (prev, if any).
// Returns its address.
func checkHealth(t *testing.T, c *client.Client, host *testutil.NS, prev string) string {
	t.Helper()
	var ip string
	testutil.EventuallyErr(t, "the health endpoint ok", func() error {
		st, err := c.Status(context.Background())
		if err != nil || st.Health == nil || st.Health.State != "ok" {
			return fmt.Errorf("status %+v: %v", st, err)
		}
		ip = st.Health.IP
		return nil
	})
	if prev != "" && ip != prev {
		t.Fatalf("health endpoint moved from %s to %s across a restart", prev, ip)
	}
	if out, err := host.Exec("ping", "-c", "1", "-W", "2", ip); err != nil {
		t.Fatalf("ping health endpoint: %v\n%s", err, out)
	}
	return ip
}
