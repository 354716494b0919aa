package cni_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/cni"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// pluginDir holds the membrane-cni binary built once for the package.
var pluginDir string

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithBinaries(m, &pluginDir, "membrane-cni"))
}

// env is one test's world: a netns standing in for the host (where the
// agent's datapath and the plugin work), an agent on a temp socket, and
// libcni with a conflist pointing at both.
type env struct {
	t       *testing.T
	host    *testutil.NS
	dir     string
	socket  string
	queue   string
	cidr    netip.Prefix // the IPv4 range (invalid: none)
	cidr6   netip.Prefix // the IPv6 range (invalid: none)
	logs    *testutil.LogBuffer
	agent   *agent.Agent
	fake    *datapath.Fake // set when the agent runs the fake datapath
	cni     *libcni.CNIConfig
	conf    *libcni.NetworkConfigList
	network string
	bpffs   string // the Linux datapath's pins, kept across agent restarts
}

func newEnv(t *testing.T, cidr string) *env {
	t.Helper()
	return newEnvStack(t, cidr, "")
}

// newEnvStack is newEnv with an IPv4 range, an IPv6 range or both (""
// leaves a family out).
func newEnvStack(t *testing.T, cidr, cidr6 string) *env {
	t.Helper()
	testutil.RequireRoot(t)
	dir := t.TempDir()
	e := &env{t: t, host: testutil.NewNS(t, "mbt-host"), dir: dir, socket: filepath.Join(dir, "agent.sock"),
		queue: filepath.Join(dir, "delete-queue"), logs: &testutil.LogBuffer{},
		network: "membrane-test", bpffs: testutil.BPFFSDir(t)}
	if cidr != "" {
		e.cidr = netip.MustParsePrefix(cidr)
	}
	if cidr6 != "" {
		e.cidr6 = netip.MustParsePrefix(cidr6)
	}
	e.cni = libcni.NewCNIConfigWithCacheDir([]string{pluginDir}, filepath.Join(dir, "cache"), nil)
	e.conf = e.conflist("1.1.0")
	t.Cleanup(func() {
		e.stopAgent()
		if t.Failed() {
			t.Logf("agent log:\n%s", e.logs.String())
		}
	})
	return e
}

func (e *env) conflist(version string) *libcni.NetworkConfigList {
	e.t.Helper()
	raw := fmt.Sprintf(`{"cniVersion":%q,"name":%q,"plugins":[{"type":"membrane-cni","socket":%q,"deleteQueueDir":%q,"mtu":1400}]}`,
		version, e.network, e.socket, e.queue)
	conf, err := libcni.NetworkConfFromBytes([]byte(raw))
	if err != nil {
		e.t.Fatalf("conflist: %v", err)
	}
	return conf
}

// startAgent starts an in-process agent on the linux datapath in the
// test's host netns; mod may change the config (e.g. to the fake datapath).
func (e *env) startAgent(mod func(*agent.Config)) {
	e.t.Helper()
	cfg := agent.Config{
		Socket: e.socket, StateDir: filepath.Join(e.dir, "state"), IPv4Range: e.cidr, IPv6Range: e.cidr6, Datapath: "linux",
		Linux:          datapath.LinuxConfig{HostNetns: e.host.Path, BPFFS: e.bpffs, TeardownDelay: 200 * time.Millisecond},
		DeleteQueueDir: e.queue, DeleteQueueInterval: time.Hour, GCInterval: time.Second,
	}
	if mod != nil {
		mod(&cfg)
	}
	e.fake = cfg.Fake
	log := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	a, err := agent.Start(cfg, log)
	if err != nil {
		e.t.Fatalf("start agent: %v", err)
	}
	e.agent = a
}

func (e *env) stopAgent() {
	if e.agent == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.agent.Stop(ctx); err != nil {
		e.t.Errorf("stop agent: %v", err)
	}
	e.agent = nil
}

func (e *env) client() *client.Client {
	c := client.New(e.socket)
	e.t.Cleanup(c.Close)
	return c
}

// pod is a sandbox: its netns and the runtime's view of it.
type pod struct {
	ns *testutil.NS
	rt *libcni.RuntimeConf
}

func (e *env) newPod(name string) *pod {
	e.t.Helper()
	ns := testutil.NewNS(e.t, "mbt-pod")
	id := "c" + testutil.RandomSuffix(24)
	return &pod{ns: ns, rt: &libcni.RuntimeConf{
		ContainerID: id, NetNS: ns.Path, IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", name},
			{"K8S_POD_INFRA_CONTAINER_ID", id}, {"K8S_POD_UID", "uid-" + name}},
	}}
}

// inHost runs fn on a thread in the test's host netns, so the plugins
// libcni execs run there.
func (e *env) inHost(fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return e.host.Do(func() error { return fn(ctx) })
}

func (e *env) add(p *pod) (*types100.Result, error) {
	var res types.Result
	err := e.inHost(func(ctx context.Context) error {
		var err error
		res, err = e.cni.AddNetworkList(ctx, e.conf, p.rt)
		return err
	})
	if err != nil {
		return nil, err
	}
	return types100.NewResultFromResult(res)
}

func (e *env) mustAdd(p *pod) *types100.Result {
	e.t.Helper()
	res, err := e.add(p)
	if err != nil {
		e.t.Fatalf("ADD %s: %v", p.rt.ContainerID, err)
	}
	return res
}

func (e *env) del(p *pod) error {
	return e.inHost(func(ctx context.Context) error { return e.cni.DelNetworkList(ctx, e.conf, p.rt) })
}

func (e *env) check(p *pod) error {
	return e.inHost(func(ctx context.Context) error { return e.cni.CheckNetworkList(ctx, e.conf, p.rt) })
}

func (e *env) status() error {
	return e.inHost(func(ctx context.Context) error { return e.cni.GetStatusNetworkList(ctx, e.conf) })
}

func (e *env) gc(valid ...*pod) error {
	args := &libcni.GCArgs{}
	for _, p := range valid {
		args.ValidAttachments = append(args.ValidAttachments, types.GCAttachment{ContainerID: p.rt.ContainerID, IfName: p.rt.IfName})
	}
	return e.inHost(func(ctx context.Context) error { return e.cni.GCNetworkList(ctx, e.conf, args) })
}

// hostLinkExists reports whether the pod's lxc device exists in the host netns.
func (e *env) hostLinkExists(p *pod) bool {
	e.t.Helper()
	name, _ := cni.VethNames(p.rt.ContainerID, p.rt.IfName)
	_, err := e.host.Netlink(e.t).LinkByName(name)
	return err == nil
}

// allocated reports whether ip is allocated in the agent's IPAM.
func (e *env) allocated(ip netip.Addr) bool {
	e.t.Helper()
	for _, a := range e.allocations() {
		if a.IP == ip.String() {
			return true
		}
	}
	return false
}

// allocations returns every allocation of GET /v1/ipam, both families.
func (e *env) allocations() []models.IPAMAllocation {
	e.t.Helper()
	st, err := e.client().IPAMStatus(context.Background())
	if err != nil {
		e.t.Fatalf("ipam status: %v", err)
	}
	var all []models.IPAMAllocation
	for _, fam := range []*models.IPAMFamilyStatus{st.IPv4, st.IPv6} {
		if fam != nil {
			all = append(all, fam.Allocations...)
		}
	}
	return all
}

// cniCode returns the CNI error code of err (0 if it is not a CNI error).
func cniCode(err error) uint {
	var te *types.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 0
}
