//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// Addresses inside the cluster. They live only in the cluster's own
// network namespaces, so parallel clusters on one machine do not collide.
var (
	apiIP     = netip.MustParseAddr("10.99.0.1") // the underlay bridge, in the control-plane netns
	underlay  = netip.MustParsePrefix("10.99.0.0/24")
	apiServer = "https://" + apiIP.String() + ":6443"
	// clusterCIDR is the pods' range: the controller manager's node IPAM
	// gives each Node a /24 of it (spec.podCIDR), which its agent takes
	// with --ipam=kubernetes (host-local's range in the ptp arm).
	clusterCIDR = netip.MustParsePrefix("10.244.0.0/16")
	// serviceCIDR is the Services' range; its first address is the
	// kubernetes Service, dnsIP the cluster DNS (kubelet's clusterDNS).
	serviceCIDR = netip.MustParsePrefix("10.96.0.0/16")
	dnsIP       = netip.MustParseAddr("10.96.0.10")
)

// clusterDomain is kubelet's clusterDomain and CoreDNS's zone.
const clusterDomain = "cluster.local"

// nodeIP is the underlay address of node i (0-based).
func nodeIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 99, 0, byte(11 + i)}) }

// state is what teardown needs, also from another process (make
// e2e-down): written to <dir>/cluster.json as the cluster comes up.
type state struct {
	Dir string `json:"dir"`
	// Holders are the pids of the namespace holders (control plane first).
	Holders []int `json:"holders"`
	// NetNS and MntNS identify the cluster's namespaces (readlink of
	// /proc/<pid>/ns/*): every process in one of them is the cluster's.
	NetNS []string `json:"netns"`
	MntNS []string `json:"mntns"`
	// Cgroups are the pod cgroup roots, one per node, under every hierarchy.
	Cgroups []string `json:"cgroups"`
	// Nodes are the nodes' names.
	Nodes []string `json:"nodes"`
	// Built is the directory of the agent, plugin and images when the
	// cluster was kept (E2E_KEEP=1); teardown removes it too.
	Built string `json:"built,omitempty"`
}

// cluster is a running control plane and its nodes.
type cluster struct {
	state
	id     string
	bin    string // kube binaries
	tools  map[string]string
	tokens map[string]string
	cpPid  int
	procs  []*proc // etcd, kube-apiserver
	// controllers are kube-controller-manager and kube-scheduler, stopped
	// before the pods are deleted at teardown (else the Deployments'
	// ReplicaSets would recreate them).
	controllers []*proc
	nodes       []*node
	cfg         *rest.Config
	client      kubernetes.Interface
	cni         string // "membrane" or "ptp"
	// agentFlags are the chart's agent flags (its ConfigMap's data, name
	// -> value) as installed: a host-process agent runs with them too.
	agentFlags map[string]string
	// values are chart values (--set syntax) after chartValues' own.
	values []string
	// UpTime is how long up took (control plane start to every node Ready).
	UpTime time.Duration
}

// clusterConfig says what to bring up.
type clusterConfig struct {
	Nodes int
	// CNI is "membrane" (the agent and membrane-cni on every node) or
	// "ptp" (the reference ptp + host-local plugins; the comparison arm).
	CNI string
	// Bin is the directory with etcd-embed, kube-apiserver,
	// kube-controller-manager, kube-scheduler and kubelet.
	Bin string
	// Tools are the host programs by name (containerd, runc, ctr, ...).
	Tools map[string]string
	// Built holds membrane-agent, membrane-cni and the images (pause,
	// probe, coredns).
	Built string
	// Deferred leaves Membrane uninstalled: the nodes come up NotReady
	// (no CNI config) and the test installs the chart itself
	// (installMembrane, waitInstalled), as TestUninstall does after
	// taking the nodes' snapshots.
	Deferred bool
	// Values are chart values (Helm's --set syntax) added to
	// chartValues' own.
	Values []string
}

// up starts a cluster in a fresh directory; on error it tears down what
// it started.
func up(ctx context.Context, cc clusterConfig) (_ *cluster, retErr error) {
	t0 := time.Now()
	dir, err := os.MkdirTemp("", "membrane-e2e-")
	if err != nil {
		return nil, err
	}
	c := &cluster{state: state{Dir: dir}, id: filepath.Base(dir)[len("membrane-e2e-"):], bin: cc.Bin, tools: cc.Tools, cni: cc.CNI,
		values: cc.Values}
	defer func() {
		if retErr != nil {
			logf("cluster up failed: %v; logs in %s", retErr, dir)
			dumpLogs(c)
			if os.Getenv("E2E_KEEP") != "1" {
				if err := teardown(c.state); err != nil {
					logf("teardown: %v", err)
				}
			}
		}
	}()
	for i := range cc.Nodes {
		c.Nodes = append(c.Nodes, fmt.Sprintf("node-%d", i))
	}
	if err := c.startControlPlane(ctx); err != nil {
		return c, err
	}
	if err := c.installCRDs(ctx); err != nil {
		return c, err
	}
	if err := c.installDNS(ctx, cc.Nodes); err != nil {
		return c, err
	}
	if c.cni == "membrane" && !cc.Deferred {
		// The DaemonSet before the nodes: each node's pod starts once its
		// kubelet registers (the pod tolerates the not-ready taint).
		if err := c.installMembrane(ctx, versionA); err != nil {
			return c, err
		}
	}
	for i := range cc.Nodes {
		n, err := c.startNode(ctx, i, cc.Built)
		if err != nil {
			return c, fmt.Errorf("node %d: %w", i, err)
		}
		c.nodes = append(c.nodes, n)
	}
	if cc.Deferred {
		// Registered with a pod CIDR (startNode), NotReady without a CNI.
		c.UpTime = time.Since(t0)
		logf("cluster %s up in %s: %d nodes, %s not installed yet; state in %s", c.id, c.UpTime.Round(time.Millisecond), len(c.nodes), c.cni, dir)
		return c, nil
	}
	if err := c.waitInstalled(ctx); err != nil {
		return c, err
	}
	c.UpTime = time.Since(t0)
	logf("cluster %s up in %s: %d nodes (%s); state in %s", c.id, c.UpTime.Round(time.Millisecond), len(c.nodes), c.cni, dir)
	return c, nil
}

// waitInstalled waits until every node is Ready and, with Membrane, its
// agent pod Ready.
func (c *cluster) waitInstalled(ctx context.Context) error {
	for _, n := range c.nodes {
		if err := c.waitNodeReady(ctx, n); err != nil {
			return err
		}
		if c.cni == "membrane" {
			if _, err := c.waitAgentPod(ctx, n, 3*time.Minute); err != nil {
				return err
			}
		}
	}
	return nil
}

// saveState writes cluster.json (make e2e-down reads it).
func (c *cluster) saveState() error {
	data, err := json.MarshalIndent(c.state, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.Dir, "cluster.json"), data, 0o644)
}

// holder starts a process that only holds new namespaces (unshare ...
// sleep); script runs first inside them. Setsid: the cluster outlives a
// killed test binary until make e2e-down.
func (c *cluster) holder(name string, unshareArgs []string, script string) (int, error) {
	ready := filepath.Join(c.Dir, name+".ready")
	args := append(unshareArgs, "sh", "-c", script+"\ntouch \"$0\"\nexec sleep infinity", ready)
	cmd := exec.Command(c.tools["unshare"], args...)
	log, err := os.Create(filepath.Join(c.Dir, name+".log"))
	if err != nil {
		return 0, err
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s namespaces: %w", name, err)
	}
	pid := cmd.Process.Pid
	go func() { _ = cmd.Wait() }()
	c.Holders = append(c.Holders, pid)
	// The namespaces exist once the script has run inside them; before
	// that /proc/<pid>/ns/* still names the host's.
	if err := testutil.WaitFor(30*time.Second, func() bool { _, err := os.Stat(ready); return err == nil }); err != nil {
		out, _ := os.ReadFile(filepath.Join(c.Dir, name+".log"))
		_ = syscall.Kill(pid, syscall.SIGKILL)
		return 0, fmt.Errorf("%s namespaces not ready: %w\n%s", name, err, out)
	}
	kinds := []string{"net"}
	if len(unshareArgs) > 1 { // a private mount namespace too
		kinds = append(kinds, "mnt")
	}
	for _, kind := range kinds {
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, kind))
		if err != nil {
			return 0, fmt.Errorf("%s namespace of %s: %w", kind, name, err)
		}
		if isHostNS(ns) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			return 0, fmt.Errorf("%s of %s is the host's %s namespace: unshare failed", ns, name, kind)
		}
		if kind == "net" {
			c.NetNS = append(c.NetNS, ns)
		} else {
			c.MntNS = append(c.MntNS, ns)
		}
	}
	if err := c.saveState(); err != nil {
		return 0, err
	}
	return pid, nil
}

// run starts a long-lived program inside the namespaces of pid (nsenter
// -m and -u too when mnt: a node's), logging to <dir>/<name>.log.
func (c *cluster) run(name string, pid int, mnt bool, args ...string) (*proc, error) {
	ns := []string{"-t", strconv.Itoa(pid), "-n"}
	if mnt {
		ns = append(ns, "-m", "-u")
	}
	cmd := exec.Command(c.tools["nsenter"], append(append(ns, "--"), args...)...)
	log, err := os.OpenFile(filepath.Join(c.Dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return newProc(cmd), nil
}

// nsexec runs a short command inside pid's network (and mount) namespace.
func (c *cluster) nsexec(pid int, mnt bool, args ...string) error {
	ns := []string{"-t", strconv.Itoa(pid), "-n"}
	if mnt {
		ns = append(ns, "-m")
	}
	out, err := exec.Command(c.tools["nsenter"], append(append(ns, "--"), args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// startControlPlane makes the control-plane network namespace with the
// underlay bridge and starts etcd, kube-apiserver, and once it is ready
// kube-controller-manager and kube-scheduler in it.
func (c *cluster) startControlPlane(ctx context.Context) error {
	script := fmt.Sprintf(`set -e
ip link set lo up
ip link add br-underlay type bridge
ip addr add %s/%d dev br-underlay
ip link set br-underlay up`, apiIP, underlay.Bits())
	pid, err := c.holder("cp", []string{"-n"}, script)
	if err != nil {
		return err
	}
	c.cpPid = pid
	tokens, err := writeCredentials(c.Dir, net.IP(apiIP.AsSlice()), c.Nodes)
	if err != nil {
		return err
	}
	c.tokens = tokens
	d := c.Dir
	etcd, err := c.run("etcd", pid, false, filepath.Join(c.bin, "etcd-embed"), "-data-dir", filepath.Join(d, "etcd"),
		"-listen-client", "http://127.0.0.1:2379", "-listen-peer", "http://127.0.0.1:2380")
	if err != nil {
		return err
	}
	c.procs = append(c.procs, etcd)
	api, err := c.run("kube-apiserver", pid, false, filepath.Join(c.bin, "kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address=0.0.0.0", "--advertise-address="+apiIP.String(), "--secure-port=6443",
		"--cert-dir="+filepath.Join(d, "certs"),
		"--tls-cert-file="+filepath.Join(d, "tls.crt"), "--tls-private-key-file="+filepath.Join(d, "tls.key"),
		"--token-auth-file="+filepath.Join(d, "tokens.csv"),
		// ServiceAccount admission is on by default: pods get projected
		// tokens (the controller manager makes the default ServiceAccounts
		// and publishes kube-root-ca.crt).
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=https://membrane-e2e.local",
		"--service-account-key-file="+filepath.Join(d, "sa.key"),
		"--service-account-signing-key-file="+filepath.Join(d, "sa.key"),
		"--service-cluster-ip-range="+serviceCIDR.String(), "--allow-privileged=true", "--profiling=false", "--v=1",
		// exec, logs and port-forward: the kubelet at its Node's
		// InternalIP (the node names resolve nowhere), with a client
		// certificate the kubelets' client CA signed.
		"--kubelet-preferred-address-types=InternalIP",
		"--kubelet-client-certificate="+filepath.Join(d, "kubelet-client.crt"),
		"--kubelet-client-key="+filepath.Join(d, "kubelet-client.key"))
	if err != nil {
		return err
	}
	c.procs = append(c.procs, api)
	c.cfg = &rest.Config{
		Host:            apiServer,
		BearerToken:     tokens["admin"],
		TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(d, "tls.crt")},
		Dial:            netnsDialer(fmt.Sprintf("/proc/%d/ns/net", pid)),
		QPS:             200,
		Burst:           400,
	}
	if c.client, err = kubernetes.NewForConfig(c.cfg); err != nil {
		return err
	}
	if err := writeKubeconfig(filepath.Join(d, "admin.kubeconfig"), apiServer, filepath.Join(d, "tls.crt"), tokens["admin"]); err != nil {
		return err
	}
	if err := testutil.WaitFor(2*time.Minute, func() bool {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		body, err := c.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(rctx)
		return err == nil && string(body) == "ok"
	}); err != nil {
		return fmt.Errorf("kube-apiserver not ready: %w", err)
	}
	return c.startControllers()
}

// netnsDialer dials from inside the network namespace at path: the API
// server listens only on the underlay, which the host's namespace cannot
// reach (nothing of the cluster touches the host's network).
func netnsDialer(path string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := inNetns(path, func() error {
			var d net.Dialer
			var err error
			conn, err = d.DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}
}

// inNetns runs fn on a locked OS thread inside the network namespace at
// path; sockets fn opens stay in that namespace. The thread is discarded
// afterwards rather than switched back.
func inNetns(path string, fn func() error) error {
	h, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer h.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(h); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// waitNodeReady waits until the Node reports Ready (kubelet registered,
// the runtime's CNI config loaded) and the node lifecycle controller has
// lifted its not-ready taint (else the scheduler skips the node). With
// Membrane the conflist is the DaemonSet's install-cni's to write: a
// node Ready without it is an error.
func (c *cluster) waitNodeReady(ctx context.Context, n *node) error {
	var early error
	err := testutil.WaitFor(3*time.Minute, func() bool {
		if n.failed() != nil {
			return true
		}
		no, err := c.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		if c.cni == "membrane" && nodeReady(no) {
			if _, err := os.Stat(filepath.Join(n.dir, "net.d", "05-membrane.conflist")); err != nil {
				early = fmt.Errorf("node %s Ready without the conflist install-cni writes: %w", n.name, err)
				return true
			}
		}
		for _, t := range no.Spec.Taints {
			if t.Key == corev1.TaintNodeNotReady {
				return false
			}
		}
		for _, cond := range no.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return true
			}
		}
		return false
	})
	if err == nil {
		err = n.failed()
	}
	if err == nil {
		err = early
	}
	if err != nil {
		return fmt.Errorf("node %s not Ready: %w (logs in %s)", n.name, err, n.dir)
	}
	return nil
}

func nodeReady(no *corev1.Node) bool {
	for _, cond := range no.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitPodCIDR waits until kubelet has registered n's Node and the
// controller manager's node IPAM has given it a pod range (the agent,
// --ipam=kubernetes, takes it from there too); then the underlay routes
// that range to the node, as a cloud's route controller would: the
// control plane (the API server answering CoreDNS, say) reaches pods.
func (c *cluster) waitPodCIDR(ctx context.Context, n *node) error {
	var cidr string
	err := testutil.WaitFor(2*time.Minute, func() bool {
		if n.failed() != nil {
			return true
		}
		no, err := c.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err == nil {
			cidr = no.Spec.PodCIDR
		}
		return cidr != ""
	})
	if err == nil {
		err = n.failed()
	}
	if err != nil {
		return fmt.Errorf("node %s: no pod CIDR from the node IPAM: %w (logs in %s and kube-controller-manager.log)", n.name, err, n.dir)
	}
	p, err := netip.ParsePrefix(cidr)
	if err != nil || !clusterCIDR.Contains(p.Addr()) {
		return fmt.Errorf("node %s: pod CIDR %q not in %s (%v)", n.name, cidr, clusterCIDR, err)
	}
	n.cidr = p
	return c.nsexec(c.cpPid, false, "ip", "route", "add", p.String(), "via", n.ip.String())
}

// errExited reports a cluster process that exited.
var errExited = errors.New("exited")
