//go:build linux

package e2e

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// kprArgs are the agent's kube-proxy replacement flags when
// E2E_KUBE_PROXY_REPLACEMENT=1 (make conformance): NodePorts and
// external addresses translated too, NodePort traffic from outside on
// the node's underlay (eth0), and socket-level translation for the
// processes of the node's pod cgroup in the cgroup2 hierarchy (pods,
// hostNetwork ones included; never the cgroup2 root, which would be
// every process of the machine, the other nodes' too). The cluster has
// no kube-proxy either way: without the option Services are ClusterIPs
// reached from pods only.
func (n *node) kprArgs() []string {
	if os.Getenv("E2E_KUBE_PROXY_REPLACEMENT") != "1" {
		return nil
	}
	return []string{"--kube-proxy-replacement=true", "--devices=eth0",
		"--socket-lb-cgroup=" + filepath.Join(cgroup2Mount(), n.cgroup)}
}

// cgroup2Mount is the cgroup2 mount point (/sys/fs/cgroup/unified on
// this cgroup v1 host), "" when there is none (the agent then refuses
// the empty cgroup's path).
func cgroup2Mount() string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if i := slices.Index(fields, "-"); i > 4 && i+1 < len(fields) && fields[i+1] == "cgroup2" {
			return fields[4]
		}
	}
	return ""
}
