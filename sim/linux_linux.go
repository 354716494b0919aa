//go:build linux

package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// --datapath linux: the agent runs in-process on the Linux datapath (real
// veths, routes and BPF programs) in a network namespace the harness
// made to stand in for the host, with its pins on a bpffs the harness
// mounted on a temporary directory. Pods are attached by the real
// membrane-cni binary through libcni, each in its own network namespace,
// removed after its DEL as a runtime removes the sandbox. Everything is
// removed when the run ends, fails or is interrupted (AbortCleanup).

// checkLinuxHost says whether this process can run the linux datapath.
func checkLinuxHost() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("datapath (--datapath): linux needs root (network namespaces, veths, BPF): %w", ErrLinuxUnavailable)
	}
	return nil
}

// linuxEnv is what a linux run creates in the kernel and removes at the
// end: the host netns, the bpffs mount and one netns per pod.
type linuxEnv struct {
	prefix string // netns name prefix, unique per run: "msim-<8 hex>-"
	host   *testutil.NS
	bpffs  string // a bpffs mounted on a temporary directory
	nl     *netlink.Handle
	// tmpDir is the run's temporary directory (socket, state), removed
	// by cleanup too so that AbortCleanup leaves nothing; "" if the user
	// chose the directory.
	tmpDir string

	mu   sync.Mutex              // guards pods and done
	pods map[string]*testutil.NS // by container ID
	done bool
}

// activeEnvs are the linux environments of runs in progress, for AbortCleanup.
var activeEnvs sync.Map // *linuxEnv -> struct{}

// AbortCleanup removes what the linux runs in progress created (network
// namespaces, the bpffs mount), for a program about to exit without
// letting Run return (a second interrupt).
func AbortCleanup() {
	activeEnvs.Range(func(k, _ any) bool {
		_ = k.(*linuxEnv).cleanup()
		return true
	})
}

func newLinuxEnv() (_ *linuxEnv, retErr error) {
	l := &linuxEnv{prefix: "msim-" + testutil.RandomSuffix(8) + "-", pods: map[string]*testutil.NS{}}
	activeEnvs.Store(l, struct{}{})
	defer func() {
		if retErr != nil {
			_ = l.cleanup()
		}
	}()
	host, err := testutil.CreateNS(l.prefix + "host")
	if err != nil {
		return nil, fmt.Errorf("linux env: %w", err)
	}
	l.host = host
	h, err := host.Handle()
	if err != nil {
		return nil, fmt.Errorf("linux env: %w", err)
	}
	defer h.Close()
	if l.nl, err = netlink.NewHandleAt(h); err != nil {
		return nil, fmt.Errorf("linux env: netlink in %s: %w", host.Name, err)
	}
	dir, err := os.MkdirTemp("", "membrane-sim-bpffs-")
	if err != nil {
		return nil, fmt.Errorf("linux env: %w", err)
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		_ = os.Remove(dir)
		return nil, fmt.Errorf("linux env: mount bpffs at %s: %w", dir, err)
	}
	l.bpffs = dir
	return l, nil
}

// podNS returns the pod's netns, creating it on first use.
func (l *linuxEnv) podNS(cid string) (*testutil.NS, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return nil, errors.New("pod netns: the run's environment is removed")
	}
	if ns := l.pods[cid]; ns != nil {
		return ns, nil
	}
	ns, err := testutil.CreateNS(l.prefix + cid)
	if err != nil {
		return nil, fmt.Errorf("pod netns: %w", err)
	}
	l.pods[cid] = ns
	return ns, nil
}

// podPath is the pod's netns path, "" if it has none.
func (l *linuxEnv) podPath(cid string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ns := l.pods[cid]; ns != nil {
		return ns.Path
	}
	return ""
}

// removePod removes the pod's netns (its veth pair goes with it).
func (l *linuxEnv) removePod(cid string) error {
	l.mu.Lock()
	ns := l.pods[cid]
	delete(l.pods, cid)
	l.mu.Unlock()
	if ns == nil {
		return nil
	}
	return ns.Remove()
}

// cleanup removes every netns of the run (also any a crash of this
// program's bookkeeping missed, by prefix) and the bpffs mount. Idempotent.
func (l *linuxEnv) cleanup() error {
	l.mu.Lock()
	pods := l.pods
	l.pods, l.done = map[string]*testutil.NS{}, true
	l.mu.Unlock()
	var errs []error
	for _, ns := range pods {
		errs = append(errs, ns.Remove())
	}
	if entries, err := os.ReadDir("/var/run/netns"); err == nil {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), l.prefix) {
				errs = append(errs, (&testutil.NS{Name: e.Name(), Path: filepath.Join("/var/run/netns", e.Name())}).Remove())
			}
		}
	}
	if l.nl != nil {
		l.nl.Close()
		l.nl = nil
	}
	if l.bpffs != "" {
		if err := unix.Unmount(l.bpffs, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", l.bpffs, err))
		}
		if err := os.Remove(l.bpffs); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if l.tmpDir != "" {
		errs = append(errs, os.RemoveAll(l.tmpDir))
	}
	activeEnvs.Delete(l)
	return errors.Join(errs...)
}

// setupLinux builds the linux target and the CNI driver; undo removes
// what they created in the kernel.
func (e *engine) setupLinux(cfg agent.Config) (undo func(), err error) {
	binDir, err := LocateCNI(e.opts.CNIBinDir)
	if err != nil {
		return nil, err
	}
	env, err := newLinuxEnv()
	if err != nil {
		return nil, err
	}
	if e.opts.Dir == "" {
		env.tmpDir = e.dir
	}
	cfg.Datapath, cfg.Fake = "linux", nil
	// Dual-stack: an IPv6 range as large as the IPv4 one, so that a pod
	// gets an address of each family for as long as the IPv4 pool lasts.
	cfg.IPv6Range = linuxIPv6Range(cfg.IPv4Range)
	cfg.Linux = datapath.LinuxConfig{HostNetns: env.host.Path, BPFFS: env.bpffs, TeardownDelay: 200 * time.Millisecond}
	if cfg.Linux.L7, err = e.linuxProxy(binDir); err != nil {
		_ = env.cleanup()
		return nil, err
	}
	cfg.DeleteQueueDir = filepath.Join(e.dir, "delete-queue")
	cfg.DeleteQueueInterval = time.Second
	// Two passes remove an orphan: the interval must exceed the longest ADD.
	cfg.GCInterval = 2 * time.Second
	hook := newLogHook(e.opts.AgentLog)
	tgt := &linuxTarget{inProcess: &inProcess{cfg: cfg, log: slog.New(hook), hook: hook, c: client.New(cfg.Socket), seed: e.sc.Seed}, env: env}
	e.tgt = tgt
	api := &apiDriver{c: tgt.Client(), rec: e.rec, gate: &e.gate, epoch: &e.epoch}
	drv, err := newCNIDriver(api, env, binDir, e.dir, cfg)
	if err != nil {
		_ = env.cleanup()
		return nil, err
	}
	e.drv = drv
	return func() {
		if err := env.cleanup(); err != nil {
			e.note("linux cleanup: " + err.Error())
			e.log.Warn("linux cleanup", "err", err)
		}
	}, nil
}

// linuxProxy configures the real L7 proxy for the proxy faults
// (faults.proxy_acks > 0): membrane-proxy from the membrane-cni
// directory, its acknowledgements delayed by faults.proxy_ack_delay and
// lost with faults.proxy_ack_drop_rate (one proxy, whatever proxy_acks
// says). None without proxy faults.
func (e *engine) linuxProxy(binDir string) (datapath.L7Config, error) {
	f := e.sc.Faults
	if f.ProxyAcks == 0 {
		return datapath.L7Config{}, nil
	}
	proxy := filepath.Join(binDir, "membrane-proxy")
	if st, err := os.Stat(proxy); err != nil || !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
		return datapath.L7Config{}, fmt.Errorf("faults.proxy_acks with --datapath linux runs the real proxy: no membrane-proxy in %s (make build): %w",
			binDir, ErrLinuxUnavailable)
	}
	e.l7 = true
	return datapath.L7Config{ProxyPath: proxy, XDSSocket: filepath.Join(e.dir, "xds.sock"), Listen: "127.0.0.1:15001",
		ProxyArgs:  []string{"--ack-delay", f.ProxyAckDelay.D().String(), "--ack-drop-rate", strconv.FormatFloat(f.ProxyAckDropRate, 'g', -1, 64)},
		MinBackoff: 10 * time.Millisecond, MaxBackoff: time.Second}, nil
}

// LocateCNI returns the directory holding the membrane-cni binary: dir if
// given, else the running program's directory, ./bin, or PATH.
func LocateCNI(dir string) (string, error) {
	const bin = "membrane-cni"
	var cands []string
	if dir != "" {
		cands = []string{dir}
	} else {
		if exe, err := os.Executable(); err == nil {
			cands = append(cands, filepath.Dir(exe))
		}
		cands = append(cands, "bin")
		if p, err := exec.LookPath(bin); err == nil {
			cands = append(cands, filepath.Dir(p))
		}
	}
	for _, d := range cands {
		if st, err := os.Stat(filepath.Join(d, bin)); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			abs, err := filepath.Abs(d)
			if err != nil {
				return "", fmt.Errorf("locate membrane-cni: %w", err)
			}
			return abs, nil
		}
	}
	return "", fmt.Errorf("locate membrane-cni: not found in %v (run `make build`, or pass --cni-bin DIR): %w", cands, ErrLinuxUnavailable)
}

// linuxTarget is the in-process agent on the Linux datapath.
type linuxTarget struct {
	*inProcess
	env *linuxEnv
}

var (
	_ Target        = (*linuxTarget)(nil)
	_ kernelChecker = (*linuxTarget)(nil)
)

// Crash kills the agent, then closes its datapath's descriptors (netlink
// sockets, BPF maps, the drop ring reader), as the kernel does for a
// killed process; pinned objects stay.
func (t *linuxTarget) Crash() error {
	a, _ := t.current()
	if err := t.inProcess.Crash(); err != nil {
		return err
	}
	if a != nil {
		_ = a.System.Datapath.Close()
	}
	return nil
}

// SetFaults does nothing: the fake datapath's faults have no kernel
// counterpart here (client timeouts and crashes still apply).
func (t *linuxTarget) SetFaults(Faults) {}

// kernelFindings: every endpoint's host veth exists and its pins are
// under <bpffs>/endpoints/<id>; every endpoint has both addresses
// (dual-stack), each routed to its host veth; no lxc veth and no pin
// directory belongs to no endpoint.
func (t *linuxTarget) kernelFindings(s *Snapshot) []finding {
	var out []finding
	links, err := t.env.nl.LinkList()
	if err != nil {
		return []finding{{invKernel, "links", "", "listing the host netns's links: " + err.Error()}}
	}
	routes := map[netip.Addr]int{} // host route destination -> interface index
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := t.env.nl.RouteList(nil, fam)
		if err != nil {
			return []finding{{invKernel, "routes", "", "listing the host netns's routes: " + err.Error()}}
		}
		for _, r := range rs {
			if r.Dst == nil {
				continue
			}
			if ones, bits := r.Dst.Mask.Size(); ones == bits {
				if ip, ok := netip.AddrFromSlice(r.Dst.IP); ok {
					routes[ip.Unmap()] = r.LinkIndex
				}
			}
		}
	}
	for _, ep := range s.Endpoints {
		if ep.ContainerID == "" {
			continue
		}
		for _, ip := range []netip.Addr{ep.IPv4, ep.IPv6} {
			switch idx, ok := routes[ip]; {
			case !ip.IsValid():
				out = append(out, finding{invKernel, "endpoint " + strconv.Itoa(int(ep.ID)), ep.ContainerID,
					fmt.Sprintf("%s: addresses %s, %s: want one of each family", epName(ep), ep.IPv4, ep.IPv6)})
			case !ok || idx != ep.IfIndex:
				out = append(out, finding{invKernel, "ip " + ip.String(), ep.ContainerID,
					fmt.Sprintf("%s: no host route for %s through %s (index %d)", epName(ep), ip, ep.IfName, ep.IfIndex)})
			}
		}
	}
	veths := map[string]bool{}
	for _, l := range links {
		if name := l.Attrs().Name; strings.HasPrefix(name, "lxc") {
			veths[name] = true
		}
	}
	pins := map[string]bool{}
	if entries, err := os.ReadDir(filepath.Join(t.env.bpffs, "endpoints")); err == nil {
		for _, e := range entries {
			pins[e.Name()] = true
		}
	}
	for _, ep := range s.Endpoints {
		id := strconv.Itoa(int(ep.ID))
		if !veths[ep.IfName] {
			out = append(out, finding{invKernel, "endpoint " + id, ep.ContainerID, fmt.Sprintf("%s: host veth %q missing", epName(ep), ep.IfName)})
		}
		if !pins[id] {
			out = append(out, finding{invKernel, "endpoint " + id, ep.ContainerID, fmt.Sprintf("%s: no pins under %s/endpoints/%s", epName(ep), t.env.bpffs, id)})
		}
		delete(veths, ep.IfName)
		delete(pins, id)
	}
	for name := range veths {
		out = append(out, finding{invKernel, "veth " + name, "", fmt.Sprintf("host veth %s belongs to no endpoint", name)})
	}
	for id := range pins {
		out = append(out, finding{invKernel, "pins " + id, "", fmt.Sprintf("pin directory endpoints/%s belongs to no endpoint", id)})
	}
	return out
}

// cniDriver attaches pods with membrane-cni through libcni (ADD and DEL)
// and does the rest over the API.
type cniDriver struct {
	*apiDriver
	env  *linuxEnv
	cni  *libcni.CNIConfig
	conf *libcni.NetworkConfigList
}

var _ Driver = (*cniDriver)(nil)

func newCNIDriver(api *apiDriver, env *linuxEnv, binDir, dir string, cfg agent.Config) (*cniDriver, error) {
	raw := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"plugins":[{"type":"membrane-cni","socket":%q,"deleteQueueDir":%q,"mtu":1400}]}`,
		cniNetwork, cfg.Socket, cfg.DeleteQueueDir)
	conf, err := libcni.NetworkConfFromBytes([]byte(raw))
	if err != nil {
		return nil, fmt.Errorf("cni driver: conflist: %w", err)
	}
	// An explicit exec: libcni makes its default lazily, racing when the
	// first calls are concurrent.
	ex := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
	return &cniDriver{apiDriver: api, env: env, conf: conf,
		cni: libcni.NewCNIConfigWithCacheDir([]string{binDir}, filepath.Join(dir, "cni-cache"), ex)}, nil
}

func (d *cniDriver) rt(p PodRef, netns string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: p.ContainerID, NetNS: netns, IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", p.Namespace}, {"K8S_POD_NAME", p.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", p.ContainerID}}}
}

// Add runs CNI ADD in a new netns, then sets the pod's labels as the
// Kubernetes watcher would (the plugin labels endpoints with the network
// and namespace only). A failed ADD may have left anything behind: the
// DEL that follows and the sweep clean up.
func (d *cniDriver) Add(ctx context.Context, p PodRef) (AddResult, error) {
	var res AddResult
	ns, err := d.env.podNS(p.ContainerID)
	if err != nil {
		return res, fmt.Errorf("add %s: %w", p.ContainerID, err)
	}
	var out cnitypes.Result
	err = d.call(ctx, opCNIAdd, func(ctx context.Context) error {
		return d.env.host.Do(func() (err error) {
			out, err = d.cni.AddNetworkList(ctx, d.conf, d.rt(p, ns.Path))
			return err
		})
	})
	if err != nil {
		res.IPAMUnknown, res.CreateUnknown = true, true
		return res, fmt.Errorf("add %s: cni: %w", p.ContainerID, err)
	}
	r, err := types100.NewResultFromResult(out)
	if err != nil {
		return res, fmt.Errorf("add %s: cni result (%v): %w", p.ContainerID, err, errBadAnswer)
	}
	if res.IPv4, err = dualStackResult(r); err != nil {
		return res, fmt.Errorf("add %s: %w", p.ContainerID, err)
	}
	var add []string
	for _, l := range p.Labels {
		if l != nsLabel { // the plugin set it
			add = append(add, l)
		}
	}
	var ep *models.Endpoint
	err = d.call(ctx, opRelabel, func(ctx context.Context) (err error) {
		ep, err = d.c.EndpointPatchLabels(ctx, "container-id:"+p.ContainerID, add, []string{"cni:network=" + cniNetwork})
		return err
	})
	if err != nil {
		return res, fmt.Errorf("add %s: labels: %w", p.ContainerID, err)
	}
	// The pod counts as added once its labels are durable. The PATCH
	// answers once they are; the regeneration is kept so that a linux ADD
	// also measures the first regeneration with the pod's identity.
	if err := d.Regenerate(ctx, p); err != nil {
		return res, fmt.Errorf("add %s: labels: %w", p.ContainerID, err)
	}
	res.Endpoint = ep.ID
	return res, nil
}

// Del runs CNI DEL (the plugin queues it if the agent is down) and then
// removes the pod's netns. Whether the endpoint existed is asked first
// (CNI DEL does not say): only a ready agent's 404 counts as not found,
// because a restarted agent serves reads while it restores (GET /v1/status
// answers 503 until then), and only if no crash came between the two calls.
func (d *cniDriver) Del(ctx context.Context, p PodRef) (DelResult, error) {
	found := true
	incarnation := d.epoch.Load()
	err := d.call(ctx, opList, func(ctx context.Context) error {
		if _, err := d.c.Status(ctx); err != nil {
			return err
		}
		_, err := d.c.EndpointGet(ctx, "container-id:"+p.ContainerID)
		return err
	})
	if isNotFound(err) && d.epoch.Load() == incarnation {
		found = false
	}
	netns := d.env.podPath(p.ContainerID)
	err = d.call(ctx, opCNIDel, func(ctx context.Context) error {
		return d.env.host.Do(func() error { return d.cni.DelNetworkList(ctx, d.conf, d.rt(p, netns)) })
	})
	if err != nil {
		return DelResult{}, fmt.Errorf("del %s: cni: %w", p.ContainerID, err)
	}
	if !found && p.IPv4.IsValid() {
		if err := d.Release(ctx, p.IPv4); err != nil {
			return DelResult{}, fmt.Errorf("del %s: %w", p.ContainerID, err)
		}
	}
	if err := d.env.removePod(p.ContainerID); err != nil {
		return DelResult{}, fmt.Errorf("del %s: %w", p.ContainerID, err)
	}
	return DelResult{Found: found}, nil
}

// simIPv6Base is the IPv6 range's prefix in --datapath linux.
var simIPv6Base = netip.MustParseAddr("fd00:5153::")

// linuxIPv6Range is the IPv6 range of --datapath linux: as many
// addresses as v4 (a prefix of 96 + v4's bits) under simIPv6Base.
func linuxIPv6Range(v4 netip.Prefix) netip.Prefix {
	return netip.PrefixFrom(simIPv6Base, 96+v4.Bits())
}

// dualStackResult checks that an ADD's result holds one IPv4 and one
// IPv6 address, each on the pod's interface, and returns the IPv4 one
// (the model tracks IPv4; the IPv6 addresses are checked through the
// index: pool arithmetic, nothing owned twice, nothing left).
func dualStackResult(r *types100.Result) (netip.Addr, error) {
	var v4, v6 netip.Addr
	for _, ipc := range r.IPs {
		ip, ok := netip.AddrFromSlice(ipc.Address.IP)
		if !ok || ipc.Interface == nil || *ipc.Interface != 1 {
			return v4, fmt.Errorf("cni result address %+v: %w", ipc, errBadAnswer)
		}
		if ip = ip.Unmap(); ip.Is4() {
			v4 = ip
		} else {
			v6 = ip
		}
	}
	if len(r.IPs) != 2 || !v4.IsValid() || !v6.IsValid() {
		return v4, fmt.Errorf("cni result %v: want an IPv4 and an IPv6 address: %w", r.IPs, errBadAnswer)
	}
	return v4, nil
}
