//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// node is one worker: a network+mount namespace with containerd, kubelet
// and (CNI membrane) membrane-agent, its files under dir.
type node struct {
	c      *cluster
	name   string
	idx    int
	ip     netip.Addr
	cidr   netip.Prefix
	pid    int // namespace holder
	dir    string
	cgroup string
	built  string
	procs  map[string]*proc // containerd, kubelet, agent
}

// nodeMounts is the node's private view of the host: /run (sockets,
// netns files, the agent's state), /var/lib and /var/log (paths kubelet
// hard-codes) are tmpfs, bpffs is its own instance, and the host-global
// sysctls kubelet checks are masked read-only with the values it wants
// (protectKernelDefaults: it never writes the host's). The node's CNI
// directories appear at the same paths on every node (nodeCNIBin,
// nodeCNIConf: the DaemonSet's hostPaths); every mount is made shared
// within the node's namespace (new peer groups: nothing propagates to or
// from the host), as on a systemd host, so that the DaemonSet's
// HostToContainer and Bidirectional mounts work.
const nodeMounts = `set -e
mount -t tmpfs tmpfs /run
mkdir -p /run/netns /run/containerd /run/membrane
mount -t tmpfs tmpfs /var/lib
mkdir -p /var/lib/cni /var/lib/kubelet
mount -t tmpfs tmpfs /var/log
mount -t bpf bpf /sys/fs/bpf
for kv in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 \
          kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
  k=${kv%%=*}; f=SYSCTL/$(echo $k | tr / .); echo ${kv#*=} > $f
  mount --bind $f /proc/sys/$k
  mount -o remount,bind,ro /proc/sys/$k
done
mkdir -p NODECNIBIN NODECNICONF NODECGROUP2
mount --bind NODEDIR/cni-bin NODECNIBIN
mount --bind NODEDIR/net.d NODECNICONF
mount --make-rshared /
ip link set lo up`

// startNode makes node i's namespaces, plugs it into the underlay and
// starts containerd, the agent (CNI membrane) and kubelet.
func (c *cluster) startNode(ctx context.Context, i int, built string) (*node, error) {
	n := &node{c: c, name: c.Nodes[i], idx: i, ip: nodeIP(i), built: built,
		dir: filepath.Join(c.Dir, c.Nodes[i]), cgroup: "membrane-e2e-" + c.id + "-" + strconv.Itoa(i),
		procs: map[string]*proc{}}
	for _, d := range []string{"sysctl", "net.d", "cni-bin", "kubelet", "pod-logs", "ipam"} {
		if err := os.MkdirAll(filepath.Join(n.dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	c.Cgroups = append(c.Cgroups, n.cgroup)
	if err := c.saveState(); err != nil {
		return nil, err
	}
	script := strings.NewReplacer("SYSCTL", filepath.Join(n.dir, "sysctl"), "NODEDIR", n.dir,
		"NODECNIBIN", nodeCNIBin, "NODECNICONF", nodeCNIConf, "NODECGROUP2", nodeCgroup2).Replace(nodeMounts)
	// A UTS namespace too, named after the node: hostNetwork pods see the
	// node's hostname, as on a real node (upstream's specs check it).
	script = "hostname " + n.name + "\n" + script
	pid, err := c.holder(n.name, []string{"-m", "-n", "-u", "--propagation", "private"}, script)
	if err != nil {
		return nil, err
	}
	n.pid = pid
	if err := n.plugUnderlay(); err != nil {
		return nil, err
	}
	if err := n.makeCgroups(); err != nil {
		return nil, err
	}
	if cg2 := testutil.Cgroup2Mount(); cg2 != "" { // none: the agent refuses the empty cgroup path
		// The node's pod cgroup in the cgroup2 hierarchy at nodeCgroup2
		// (the chart's cgroup.hostRoot with the kube-proxy replacement):
		// socket-level translation for the node's pods only, never the
		// machine's root cgroup.
		if err := c.nsexec(n.pid, true, "mount", "--bind", filepath.Join(cg2, n.cgroup), nodeCgroup2); err != nil {
			return nil, err
		}
	}
	if err := n.writeConfig(); err != nil {
		return nil, err
	}
	if err := n.startContainerd(); err != nil {
		return nil, err
	}
	if err := n.startKubelet(); err != nil {
		return nil, err
	}
	// Kubelet registers the Node, the controller manager's node IPAM
	// gives it a pod range.
	if err := c.waitPodCIDR(ctx, n); err != nil {
		return nil, err
	}
	if c.cni != "membrane" {
		// host-local needs the range in its conflist; containerd picks
		// the file up when it appears.
		return n, n.writePtpConflist()
	}
	// The DaemonSet's pod (installMembrane) installs the plugin and the
	// conflist and runs the agent, which takes its range from the Node's
	// podCIDRs (--ipam=kubernetes); up waits for it.
	return n, nil
}

// plugUnderlay adds a veth from the underlay bridge (control-plane netns)
// to the node's eth0 and addresses it.
func (n *node) plugUnderlay() error {
	c := n.c
	port := "ul-" + n.name
	if err := c.nsexec(c.cpPid, false, "ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", strconv.Itoa(n.pid)); err != nil {
		return err
	}
	if err := c.nsexec(c.cpPid, false, "ip", "link", "set", port, "master", "br-underlay", "up"); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"ip", "addr", "add", fmt.Sprintf("%s/%d", n.ip, underlay.Bits()), "dev", "eth0"},
		{"ip", "link", "set", "eth0", "up"},
		{"ip", "route", "add", "default", "via", apiIP.String()},
	} {
		if err := c.nsexec(n.pid, false, args...); err != nil {
			return err
		}
	}
	return nil
}

// makeCgroups creates the node's pod cgroup root under every v1
// hierarchy (cgroupfs is host-global; teardown removes it).
func (n *node) makeCgroups() error {
	hs := cgroupHierarchies()
	for _, h := range hs {
		if err := os.MkdirAll(filepath.Join(h, n.cgroup), 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", n.cgroup, err)
		}
	}
	if cs := "/sys/fs/cgroup/cpuset"; dirExists(cs) {
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			v, err := os.ReadFile(filepath.Join(cs, f))
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(cs, n.cgroup, f), v, 0o644); err != nil {
				return fmt.Errorf("cgroup %s %s: %w", n.cgroup, f, err)
			}
		}
	}
	return nil
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// writeConfig writes containerd.toml, kubelet.yaml and the loopback
// plugin (and ptp's). membrane-cni and Membrane's conflist are the
// DaemonSet's install-cni's to write (the chart's conflist: its socket
// /var/run/membrane/membrane.sock is the node's own /run). The ptp arm's
// conflist waits for the node's pod range (writePtpConflist).
func (n *node) writeConfig() error {
	d := n.dir
	toml := fmt.Sprintf(containerdTOML, filepath.Join(d, "root"), filepath.Join(d, "state"), n.sock(),
		filepath.Join(d, "opt"), n.c.tools["runc"], filepath.Join(d, "cni-bin"), filepath.Join(d, "net.d"))
	if err := os.WriteFile(filepath.Join(d, "containerd.toml"), []byte(toml), 0o644); err != nil {
		return err
	}
	nofile := hardNofile()
	kubelet := fmt.Sprintf(kubeletYAML, n.sock(), n.cgroup, filepath.Join(d, "pod-logs"), filepath.Join(d, "kubelet", "volume-plugins"), nofile,
		dnsIP, clusterDomain, filepath.Join(n.c.Dir, "tls.crt"))
	if err := os.WriteFile(filepath.Join(d, "kubelet.yaml"), []byte(kubelet), 0o644); err != nil {
		return err
	}
	if err := writeKubeconfig(filepath.Join(d, "kubelet.kubeconfig"), apiServer, filepath.Join(n.c.Dir, "tls.crt"), n.c.tokens[n.name]); err != nil {
		return err
	}
	links := map[string]string{"loopback": n.c.tools["loopback"]}
	if n.c.cni != "membrane" {
		dir := filepath.Dir(n.c.tools["loopback"])
		links["ptp"], links["host-local"] = filepath.Join(dir, "ptp"), filepath.Join(dir, "host-local")
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(d, "cni-bin", name)); err != nil {
			return err
		}
	}
	return nil
}

// writePtpConflist writes the ptp arm's conflist: ptp + host-local on the
// node's pod range.
func (n *node) writePtpConflist() error {
	conf := fmt.Appendf(nil, ptpConflist, filepath.Join(n.dir, "ipam"), n.cidr)
	return writeConflist(filepath.Join(n.dir, "net.d", "10-ptp.conflist"), conf)
}

// writeConflist checks that conf is JSON and writes it to path through a
// rename, so containerd never loads half a file.
func writeConflist(path string, conf []byte) error {
	var check map[string]any
	if err := json.Unmarshal(conf, &check); err != nil {
		return fmt.Errorf("conflist %s: %w", path, err)
	}
	if err := os.WriteFile(path+".tmp", conf, 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

func (n *node) sock() string { return filepath.Join(n.dir, "containerd.sock") }

// agentSocket is the agent's API socket seen from the host.
func (n *node) agentSocket() string {
	return fmt.Sprintf("/proc/%d/root/run/membrane/membrane.sock", n.pid)
}

// netnsPath is the node's network namespace seen from the host.
func (n *node) netnsPath() string { return fmt.Sprintf("/proc/%d/ns/net", n.pid) }

func (n *node) startContainerd() error {
	cmd, err := n.c.run(n.name+"/containerd", n.pid, true, n.c.tools["containerd"], "--config", filepath.Join(n.dir, "containerd.toml"))
	if err != nil {
		return err
	}
	n.procs["containerd"] = cmd
	if err := testutil.WaitFor(60*time.Second, func() bool {
		st, err := os.Stat(n.sock())
		return (err == nil && st.Mode()&os.ModeSocket != 0) || n.failed() != nil
	}); err != nil || n.failed() != nil {
		return fmt.Errorf("containerd not up: %v %v", err, n.failed())
	}
	imgs := []string{"pause.tar", "probe.tar", "coredns.tar"}
	if n.c.cni == "membrane" {
		imgs = append(imgs, "membrane-"+versionA+".tar", "membrane-"+versionB+".tar")
	}
	for _, img := range imgs {
		out, err := exec.Command(n.c.tools["ctr"], "--address", n.sock(), "-n", "k8s.io", "images", "import",
			filepath.Join(n.built, img)).CombinedOutput()
		if err != nil {
			return fmt.Errorf("import %s: %w: %s", img, err, out)
		}
	}
	return nil
}

// agentArgs are the host-process agent's (hostAgent): the DaemonSet
// container's fixed arguments (the same socket, state, delete-queue and
// bpffs paths on the node, so it takes over the pod's state and pins)
// and the chart's flags as installed, but the API server through the
// admin kubeconfig instead of the ServiceAccount, the host's /proc, and
// the node's pod cgroup for socket-level translation.
func (n *node) agentArgs() []string {
	args := []string{filepath.Join(n.built, "membrane-agent"),
		"--k8s-kubeconfig=" + filepath.Join(n.c.Dir, "admin.kubeconfig"),
		"--node-name=" + n.name,
		"--socket=/var/run/membrane/membrane.sock",
		"--state-dir=/var/lib/membrane/state",
		"--delete-queue-dir=/var/run/membrane/delete-queue",
		"--bpffs=/sys/fs/bpf/membrane",
	}
	names := make([]string, 0, len(n.c.agentFlags))
	for k := range n.c.agentFlags {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		v := n.c.agentFlags[k]
		switch k {
		case "socket-lb-cgroup":
			v = nodeCgroup2
		case "l7-proxy":
			if v != "" {
				v = filepath.Join(n.built, "membrane-proxy")
			}
		}
		args = append(args, "--"+k+"="+v)
	}
	return args
}

// startAgent starts membrane-agent in the node's namespaces and waits for
// its API.
func (n *node) startAgent(ctx context.Context) error {
	cmd, err := n.c.run(n.name+"/agent", n.pid, true, n.agentArgs()...)
	if err != nil {
		return err
	}
	n.procs["agent"] = cmd
	cl := client.New(n.agentSocket())
	defer cl.Close()
	err = testutil.WaitFor(2*time.Minute, func() bool {
		if n.failed() != nil {
			return true
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := cl.Status(sctx)
		return err == nil
	})
	if err == nil {
		err = n.failed()
	}
	if err != nil {
		return fmt.Errorf("agent not ready: %w", err)
	}
	return nil
}

// stopAgent stops the agent (SIGTERM, as kubelet stops a DaemonSet pod).
func (n *node) stopAgent() error {
	cmd := n.procs["agent"]
	delete(n.procs, "agent")
	return cmd.stop(30 * time.Second)
}

func (n *node) startKubelet() error {
	cmd, err := n.c.run(n.name+"/kubelet", n.pid, true, filepath.Join(n.c.bin, "kubelet"),
		"--config="+filepath.Join(n.dir, "kubelet.yaml"),
		"--kubeconfig="+filepath.Join(n.dir, "kubelet.kubeconfig"),
		"--root-dir="+filepath.Join(n.dir, "kubelet"),
		"--cert-dir="+filepath.Join(n.dir, "kubelet", "pki"),
		"--hostname-override="+n.name, "--node-ip="+n.ip.String(),
		// The DaemonSet's nodeSelector (hostAgent relabels).
		"--node-labels="+agentNodeLabel+"=pod", "--v=1")
	if err != nil {
		return err
	}
	n.procs["kubelet"] = cmd
	return nil
}

// failed returns an error when one of the node's processes has exited.
func (n *node) failed() error {
	for name, p := range n.procs {
		if p.exited() {
			return fmt.Errorf("%s %w (see %s.log)", name, errExited, filepath.Join(n.c.Dir, n.name, name))
		}
	}
	return nil
}
