//go:build linux

package e2e

import (
	"fmt"
	"os/exec"
	"syscall"
	"time"
)

// proc is a started cluster process and its reaper.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func newProc(cmd *exec.Cmd) *proc {
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits up to limit, then SIGKILLs.
func (p *proc) stop(limit time.Duration) error {
	if p == nil || p.exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(limit):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not stop on SIGTERM within %s: killed", p.cmd.Args, limit)
	}
}

// kill SIGKILLs the process (a crash, as opposed to stop).
func (p *proc) kill() {
	if p == nil || p.exited() {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// hardNofile is the hard RLIMIT_NOFILE: kubelet's maxOpenFiles (the
// default, 1000000, needs CAP_SYS_RESOURCE to raise the limit to).
func hardNofile() uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 1 << 16
	}
	return r.Max
}

// containerdTOML is the node's containerd 1.6 config: own root, state
// and sockets, the local pause image, runc with cgroupfs, CNI from the
// node's directories. Arguments: root, state, socket, opt, runc, CNI bin
// dir, CNI conf dir.
const containerdTOML = `version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = %[3]q
[ttrpc]
  address = "%[3]s.ttrpc"
[debug]
  address = "%[3]s.debug"
[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:v1"
  disable_apparmor = true
  # Without CAP_SYS_RESOURCE a negative oom_score_adj makes runc fail.
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
        BinaryName = %[5]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[6]q
    conf_dir = %[7]q
    max_conf_num = 1
`

// kubeletYAML is the node's KubeletConfiguration (the settings this
// cgroup v1 host needs are explained in shared/recipes/kube-node).
// Arguments: containerd socket, cgroup root, pod logs dir, volume plugin
// dir, max open files, cluster DNS address, cluster domain, client CA
// (the API server's kubelet-client.crt is signed by it; anonymous
// requests stay refused).
const kubeletYAML = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://%[1]s
imageServiceEndpoint: unix://%[1]s
cgroupDriver: cgroupfs
cgroupRoot: /%[2]s
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
protectKernelDefaults: true
oomScoreAdj: 0
podLogsDir: %[3]s
volumePluginDir: %[4]s
maxOpenFiles: %[5]d
maxPods: 250
clusterDNS: [%[6]s]
clusterDomain: %[7]s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %[8]q}
authorization:
  mode: AlwaysAllow
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
serializeImagePulls: false
evictionHard: {memory.available: 100Mi, nodefs.available: 1%%, imagefs.available: 1%%, nodefs.inodesFree: 1%%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`

// ptpConflist is the comparison arm: the reference ptp plugin with
// host-local on the node's range. Arguments: host-local data dir, range.
const ptpConflist = `{
  "cniVersion": "1.0.0",
  "name": "e2e-ptp",
  "plugins": [{
    "type": "ptp", "ipMasq": false, "mtu": 1500,
    "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": "%s"}]], "routes": [{"dst": "0.0.0.0/0"}]}
  }]
}`
