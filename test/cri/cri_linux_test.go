package cri

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// podCIDR is the agent's range; its first address is the gateway.
const podCIDR = "10.245.0.0/24"

// node is one test's node: containerd and the agent in a namespace of
// their own, and the files they use under dir.
type node struct {
	t          *testing.T
	dir        string
	tools      map[string]string
	holder     *exec.Cmd // unshare, exec'd into containerd: its namespaces are the node's
	mntNS      string    // the node's mount namespace (readlink of /proc/<pid>/ns/mnt)
	agent      *exec.Cmd
	cgroup     string // pod cgroup parent, under every hierarchy
	socket     string // the agent's API socket
	containerd string // containerd's CRI socket
}

// TestCRIContainerd runs two pod sandboxes through containerd 1.6's CRI
// with the shipped conflist (deploy/05-membrane.conflist, whose
// cniVersion containerd's CNI library must accept): each gets its address
// from Membrane, they ping each other, and stopp and rmp (two DELs each)
// leave no endpoint, address or veth.
func TestCRIContainerd(t *testing.T) {
	n := newNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := client.New(n.socket)
	t.Cleanup(c.Close)

	type sandbox struct {
		id  string
		ip  netip.Addr
		pid int
	}
	var pods []sandbox
	for i := range 2 {
		id := n.crictl("runp", n.podConfig(i))
		ip, pid := n.inspect(id)
		ep, err := c.EndpointGet(ctx, "cni-attachment-id:"+id+":eth0")
		if err != nil {
			t.Fatalf("agent endpoint of sandbox %s: %v", id, err)
		}
		if ep.Addressing == nil || ep.Addressing.IPv4 != ip.String() || !netip.MustParsePrefix(podCIDR).Contains(ip) {
			t.Fatalf("sandbox %s: CRI reports %s, agent endpoint %+v", id, ip, ep.Addressing)
		}
		pods = append(pods, sandbox{id, ip, pid})
	}
	for i, p := range pods {
		other := pods[1-i]
		out, err := exec.Command(n.tools["nsenter"], "-t", strconv.Itoa(p.pid), "-n", "--",
			n.tools["ping"], "-c", "1", "-W", "5", other.ip.String()).CombinedOutput()
		if err != nil {
			t.Fatalf("ping %s -> %s: %v\n%s", p.ip, other.ip, err, out)
		}
	}
	for _, p := range pods {
		n.crictl("stopp", p.id) // DEL
		n.crictl("rmp", p.id)   // DEL again
	}
	eps, err := c.EndpointList(ctx, nil)
	if err != nil || len(eps) != 0 {
		t.Fatalf("endpoints after rmp = %+v, %v", eps, err)
	}
	st, err := c.IPAMStatus(ctx)
	if err != nil || len(st.IPv4.Allocations) != 0 {
		t.Fatalf("allocations after rmp = %+v, %v", st, err)
	}
}

func newNode(t *testing.T) *node {
	t.Helper()
	testutil.RequireRoot(t)
	home, _ := os.UserHomeDir()
	n := &node{t: t, tools: map[string]string{}}
	for _, tool := range []struct {
		name string
		dirs []string
	}{
		{"containerd", nil}, {"runc", nil}, {"ctr", nil}, {"unshare", nil}, {"nsenter", nil}, {"ping", nil},
		{"crictl", []string{filepath.Join(home, ".cache", "membrane", "bin")}},
		{"loopback", []string{"/usr/lib/cni", "/opt/cni/bin"}},
	} {
		n.tools[tool.name] = testutil.RequireTool(t, tool.name, tool.dirs...)
	}
	bpffs := testutil.BPFFSDir(t) // mounted before the node's namespace copies the mounts
	dir, err := os.MkdirTemp("", "mbt-cri-")
	if err != nil {
		t.Fatal(err)
	}
	n.dir, n.socket, n.containerd = dir, filepath.Join(dir, "agent.sock"), filepath.Join(dir, "containerd.sock")
	n.cgroup = "membrane-cri-" + testutil.RandomSuffix(8)
	t.Cleanup(n.cleanup)
	n.build()
	n.writeConfig()
	n.startContainerd()
	n.startAgent(bpffs)
	n.nsx(n.tools["ctr"], "--address", n.containerd, "-n", "k8s.io", "images", "import", filepath.Join(dir, "pause.tar"))
	return n
}

// build puts membrane-cni and the loopback plugin (containerd's CRI sets
// up lo with it) in dir/cni-bin, membrane-agent in dir, and the pause
// image in dir/pause.tar.
func (n *node) build() {
	n.t.Helper()
	bin := filepath.Join(n.dir, "cni-bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		n.t.Fatal(err)
	}
	if err := testutil.BuildStatic(bin, "github.com/membrane-cni/membrane/cmd/membrane-cni"); err != nil {
		n.t.Fatal(err)
	}
	if err := testutil.BuildStatic(n.dir, "github.com/membrane-cni/membrane/cmd/membrane-agent", "./testdata/pause"); err != nil {
		n.t.Fatal(err)
	}
	if err := os.Symlink(n.tools["loopback"], filepath.Join(bin, "loopback")); err != nil {
		n.t.Fatal(err)
	}
	writePauseImage(n.t, filepath.Join(n.dir, "pause"), "localhost/pause:v1", filepath.Join(n.dir, "pause.tar"))
}

// writeConfig writes containerd.toml and net.d/ with the shipped
// conflist, its socket and delete queue pointed at dir.
func (n *node) writeConfig() {
	n.t.Helper()
	d := n.dir
	toml := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[debug]
  address = %[5]q
[plugins."io.containerd.internal.v1.opt"]
  path = %[6]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:v1"
  disable_apparmor = true
  # The sandbox's default oom_score_adj needs CAP_SYS_RESOURCE, which a
  # container running the tests may lack: clamp it to containerd's.
  restrict_oom_score_adj = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_cdi = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = %[7]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[8]q
    conf_dir = %[9]q
    max_conf_num = 1
`, filepath.Join(d, "root"), filepath.Join(d, "state"), n.containerd, n.containerd+".ttrpc",
		filepath.Join(d, "debug.sock"), filepath.Join(d, "opt"), n.tools["runc"],
		filepath.Join(d, "cni-bin"), filepath.Join(d, "net.d"))
	if err := os.WriteFile(filepath.Join(d, "containerd.toml"), []byte(toml), 0o644); err != nil {
		n.t.Fatal(err)
	}
	raw, err := os.ReadFile("../../deploy/05-membrane.conflist")
	if err != nil {
		n.t.Fatal(err)
	}
	var list map[string]any
	if err := json.Unmarshal(raw, &list); err != nil {
		n.t.Fatalf("shipped conflist: %v", err)
	}
	plugin := list["plugins"].([]any)[0].(map[string]any)
	plugin["socket"], plugin["deleteQueueDir"] = n.socket, filepath.Join(d, "delete-queue")
	out, _ := json.Marshal(list)
	if err := os.MkdirAll(filepath.Join(d, "net.d"), 0o755); err != nil {
		n.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "net.d", "05-membrane.conflist"), out, 0o644); err != nil {
		n.t.Fatal(err)
	}
}

// startContainerd starts containerd in a new mount+network namespace with
// a private /run (shim sockets, runc state, netns files) and /var/lib
// (libcni's result cache, /var/lib/cni) and lo up.
func (n *node) startContainerd() {
	n.t.Helper()
	script := `set -eu
mount -t tmpfs tmpfs /run
mkdir -p /run/netns /run/containerd
mount -t tmpfs tmpfs /var/lib
mkdir -p /var/lib/cni
ip link set lo up
exec "$0" --config "$1"`
	log, err := os.Create(filepath.Join(n.dir, "containerd.log"))
	if err != nil {
		n.t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(n.tools["unshare"], "-m", "-n", "--propagation", "private", "sh", "-c", script,
		n.tools["containerd"], filepath.Join(n.dir, "containerd.toml"))
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		n.t.Fatalf("start containerd: %v", err)
	}
	n.holder = cmd
	n.waitSocket("containerd", n.containerd)
	mnt, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", cmd.Process.Pid))
	if err != nil {
		n.t.Fatalf("containerd's mount namespace: %v", err)
	}
	n.mntNS = mnt
}

// startAgent runs membrane-agent on the Linux datapath inside the node's
// namespaces.
func (n *node) startAgent(bpffs string) {
	n.t.Helper()
	log, err := os.Create(filepath.Join(n.dir, "agent.log"))
	if err != nil {
		n.t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(n.tools["nsenter"], "-t", strconv.Itoa(n.holder.Process.Pid), "-m", "-n", "--",
		filepath.Join(n.dir, "membrane-agent"), "--socket", n.socket, "--state-dir", filepath.Join(n.dir, "agent-state"),
		"--datapath", "linux", "--bpffs", bpffs, "--ipv4-range", podCIDR, "--http-addr", "",
		"--enable-health=false", "--delete-queue-dir", filepath.Join(n.dir, "delete-queue"), "--log-level", "debug")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		n.t.Fatalf("start agent: %v", err)
	}
	n.agent = cmd
	n.waitSocket("agent", n.socket)
	c := client.New(n.socket)
	defer c.Close()
	testutil.EventuallyErr(n.t, "the agent ready", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := c.Status(ctx)
		return err
	})
}

// waitSocket waits up to a minute for a unix socket to appear (a bound
// against hangs, not a timing assertion).
func (n *node) waitSocket(what, path string) {
	n.t.Helper()
	testutil.Eventually(n.t, what+" to create "+path, func() bool {
		st, err := os.Stat(path)
		return err == nil && st.Mode()&os.ModeSocket != 0
	})
}

// nsx runs a command inside the node's namespaces.
func (n *node) nsx(args ...string) string {
	n.t.Helper()
	full := append([]string{"-t", strconv.Itoa(n.holder.Process.Pid), "-m", "-n", "--"}, args...)
	out, err := exec.Command(n.tools["nsenter"], full...).CombinedOutput()
	if err != nil {
		n.t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// crictl runs crictl against the node's containerd and returns its
// trimmed stdout.
func (n *node) crictl(args ...string) string {
	n.t.Helper()
	out, err := n.runCrictl(args...)
	if err != nil {
		n.t.Fatalf("crictl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(out)
}

func (n *node) runCrictl(args ...string) (string, error) {
	ep := "unix://" + n.containerd
	full := append([]string{"--runtime-endpoint", ep, "--image-endpoint", ep, "--timeout", "60s"}, args...)
	cmd := exec.Command(n.tools["crictl"], full...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out) + stderr.String(), err
	}
	return string(out), nil
}

// podConfig writes the sandbox config of pod i and returns its path.
func (n *node) podConfig(i int) string {
	n.t.Helper()
	cfg := map[string]any{
		"metadata":      map[string]any{"name": fmt.Sprintf("pod-%d", i), "namespace": "cri-test", "uid": fmt.Sprintf("uid-%d", i), "attempt": 0},
		"hostname":      fmt.Sprintf("pod-%d", i),
		"log_directory": filepath.Join(n.dir, "podlogs", strconv.Itoa(i)),
		"linux": map[string]any{
			"cgroup_parent":    "/" + n.cgroup,
			"security_context": map[string]any{"namespace_options": map[string]any{"network": 0, "pid": 0, "ipc": 0}},
		},
	}
	data, _ := json.Marshal(cfg)
	path := filepath.Join(n.dir, fmt.Sprintf("pod-%d.json", i))
	if err := os.WriteFile(path, data, 0o644); err != nil {
		n.t.Fatal(err)
	}
	return path
}

// inspect returns a sandbox's pod IP as the CRI reports it and the pid
// of its pause process.
func (n *node) inspect(id string) (netip.Addr, int) {
	n.t.Helper()
	var res struct {
		Status struct {
			Network struct {
				IP string `json:"ip"`
			} `json:"network"`
		} `json:"status"`
		Info struct {
			Pid int `json:"pid"`
		} `json:"info"`
	}
	out := n.crictl("inspectp", "-o", "json", id)
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		n.t.Fatalf("inspectp %s: %v\n%s", id, err, out)
	}
	ip, err := netip.ParseAddr(res.Status.Network.IP)
	if err != nil || res.Info.Pid <= 0 {
		n.t.Fatalf("inspectp %s: ip %q pid %d\n%s", id, res.Status.Network.IP, res.Info.Pid, out)
	}
	return ip, res.Info.Pid
}

// cleanup removes everything the node made, also after a failure: its
// sandboxes, containerd, the agent, every process left in its namespace
// (shims), its pod cgroups and its directory. The namespaces go with
// their last process.
func (n *node) cleanup() {
	t := n.t
	if t.Failed() {
		for _, f := range []string{"containerd.log", "agent.log"} {
			if data, err := os.ReadFile(filepath.Join(n.dir, f)); err == nil {
				t.Logf("%s:\n%s", f, tail(data, 100))
			}
		}
	}
	if n.holder != nil {
		if out, err := n.runCrictl("rmp", "-a", "-f"); err != nil {
			t.Logf("crictl rmp -a: %v\n%s", err, out)
		}
	}
	stop(t, n.agent)
	stop(t, n.holder)
	if n.mntNS != "" {
		killNamespace(t, n.mntNS)
	}
	removeCgroups(t, n.cgroup)
	if n.dir != "" {
		if err := os.RemoveAll(n.dir); err != nil {
			t.Errorf("remove %s: %v", n.dir, err)
		}
	}
}

// stop sends SIGTERM, waits up to 20 s, then SIGKILLs.
func stop(t *testing.T, cmd *exec.Cmd) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Errorf("%s did not stop on SIGTERM; killing it", cmd.Path)
		_ = cmd.Process.Kill()
		<-done
	}
}

// killNamespace kills every process still in mount namespace mnt (the
// node's: containerd's shims and what they run) and waits until none is.
func killNamespace(t *testing.T, mnt string) {
	deadline := time.Now().Add(20 * time.Second)
	for {
		pids := processesIn(mnt)
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("processes %v left in the node's namespace", pids)
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func processesIn(mnt string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err == nil && ns == mnt {
			pids = append(pids, pid)
		}
	}
	return pids
}

// removeCgroups removes the pod cgroup parent (cgroupfs is not
// namespaced: containerd made it on the host) under every hierarchy.
func removeCgroups(t *testing.T, parent string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", parent))
	if d := filepath.Join("/sys/fs/cgroup", parent); dirExists(d) {
		dirs = append(dirs, d) // cgroup v2
	}
	for _, d := range dirs {
		var all []string
		_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				all = append(all, p)
			}
			return nil
		})
		for i := len(all) - 1; i >= 0; i-- { // children first
			if err := syscall.Rmdir(all[i]); err != nil {
				t.Errorf("remove cgroup %s: %v", all[i], err)
			}
		}
	}
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

func tail(data []byte, lines int) string {
	s := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(s) > lines {
		s = s[len(s)-lines:]
	}
	return strings.Join(s, "\n")
}
