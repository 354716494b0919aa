//go:build linux

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// down stops a running cluster: the controller manager and the scheduler
// first (nothing recreates a deleted pod), then pods deleted through the
// API (so kubelet runs every CNI DEL while the agents are up), then
// kubelet, the agents and containerd with SIGTERM, then teardown.
func (c *cluster) down(ctx context.Context) error {
	var errs []error
	for _, p := range c.controllers {
		errs = append(errs, p.stop(30*time.Second))
	}
	if c.client != nil && len(c.nodes) > 0 {
		errs = append(errs, c.deleteAllPods(ctx))
	}
	for _, n := range c.nodes {
		for _, name := range []string{"kubelet", "agent", "containerd"} {
			errs = append(errs, n.procs[name].stop(30*time.Second))
		}
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		errs = append(errs, c.procs[i].stop(30*time.Second))
	}
	errs = append(errs, teardown(c.state))
	return errors.Join(errs...)
}

// deleteAllPods deletes every pod and waits until kubelet has removed
// them (their sandboxes gone, CNI DEL done): the agents' pods last, so
// that the others' DELs reach a running agent.
func (c *cluster) deleteAllPods(ctx context.Context) error {
	nss, err := c.client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list namespaces: %w", err)
	}
	for _, agents := range []bool{false, true} {
		for _, ns := range nss.Items {
			if (ns.Name == agentNamespace) != agents {
				continue
			}
			err := c.client.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
			if err != nil {
				return fmt.Errorf("delete pods in %s: %w", ns.Name, err)
			}
		}
		if err := testutil.WaitFor(2*time.Minute, func() bool {
			pods, err := c.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
			if err != nil {
				return false
			}
			for _, p := range pods.Items {
				if agents || p.Namespace != agentNamespace {
					return false
				}
			}
			return true
		}); err != nil {
			return fmt.Errorf("pods not deleted (agents %v): %w", agents, err)
		}
	}
	return nil
}

// teardown removes everything of the cluster described by st, also when
// its processes are not this binary's children (make e2e-down): every
// process in its namespaces or pod cgroups is killed (the namespaces, the
// pods' netns, veths, bpffs and tmpfs mounts go with the last one), the
// cgroups are removed, then the directory. It fails when anything is
// left.
func teardown(st state) error {
	for _, ns := range append(append([]string{}, st.NetNS...), st.MntNS...) {
		if isHostNS(ns) {
			// Killing "every process in it" would kill the machine.
			return fmt.Errorf("state of %s names %s, this process's own namespace: refusing to tear down by namespace", st.Dir, ns)
		}
	}
	err := testutil.WaitFor(30*time.Second, func() bool {
		pids := clusterProcesses(st)
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		return len(pids) == 0
	})
	var errs []error
	if err != nil {
		errs = append(errs, fmt.Errorf("processes %v still alive: %w", clusterProcesses(st), err))
	}
	for _, cg := range st.Cgroups {
		errs = append(errs, removeCgroup(cg))
	}
	if left := leftovers(st); len(left) > 0 {
		errs = append(errs, fmt.Errorf("left behind: %s", strings.Join(left, "; ")))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, d := range []string{st.Dir, st.Built} {
		if d == "" {
			continue
		}
		if err := os.RemoveAll(d); err != nil {
			return fmt.Errorf("remove %s: %w", d, err)
		}
	}
	return nil
}

// clusterProcesses lists the pids in the cluster's namespaces (the
// holders included) or pod cgroups. Namespace ids can be reused once a
// namespace is gone, so a recorded namespace counts only while one of
// its processes is a recorded holder or runs with the cluster's
// directory in its arguments (a stale cluster.json never names someone
// else's processes).
func clusterProcesses(st state) []int {
	recorded := map[string]bool{}
	for _, ns := range append(append([]string{}, st.NetNS...), st.MntNS...) {
		recorded[ns] = true
	}
	holders := map[int]bool{}
	for _, pid := range st.Holders {
		holders[pid] = true
	}
	inNS := map[string][]int{}
	trusted := map[string]bool{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		for _, kind := range []string{"net", "mnt"} {
			ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, kind))
			if err != nil || !recorded[ns] {
				continue
			}
			inNS[ns] = append(inNS[ns], pid)
			if holders[pid] || mentions(pid, st.Dir) {
				trusted[ns] = true
			}
		}
	}
	seen := map[int]bool{}
	for ns, pids := range inNS {
		if !trusted[ns] {
			continue
		}
		for _, pid := range pids {
			seen[pid] = true
		}
	}
	for _, cg := range st.Cgroups {
		for _, pid := range cgroupPids(cg) {
			seen[pid] = true
		}
	}
	pids := make([]int, 0, len(seen))
	for pid := range seen {
		pids = append(pids, pid)
	}
	return pids
}

// mentions reports whether process pid has dir in its command line.
func mentions(pid int, dir string) bool {
	if dir == "" {
		return false
	}
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(cmd), dir)
}

// cgroupDirs lists the directories of cgroup cg under every hierarchy.
func cgroupDirs(cg string) []string {
	var dirs []string
	hs := cgroupHierarchies()
	for _, h := range hs {
		if d := filepath.Join(h, cg); dirExists(d) {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// cgroupPids lists the processes anywhere under cgroup cg.
func cgroupPids(cg string) []int {
	var pids []int
	for _, d := range cgroupDirs(cg) {
		_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err != nil || e.IsDir() || e.Name() != "cgroup.procs" {
				return nil
			}
			f, err := os.Open(p)
			if err != nil {
				return nil
			}
			defer f.Close()
			s := bufio.NewScanner(f)
			for s.Scan() {
				if pid, err := strconv.Atoi(s.Text()); err == nil {
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// removeCgroup removes cg and its children under every hierarchy.
func removeCgroup(cg string) error {
	var errs []error
	for _, d := range cgroupDirs(cg) {
		var all []string
		_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				all = append(all, p)
			}
			return nil
		})
		for i := len(all) - 1; i >= 0; i-- { // children first
			if err := syscall.Rmdir(all[i]); err != nil && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", all[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// leftovers lists what of the cluster still exists on the host:
// processes, cgroups, and mounts under its directory in the host's mount
// namespace (the nodes' mounts are private to their namespaces).
func leftovers(st state) []string {
	var left []string
	if pids := clusterProcesses(st); len(pids) > 0 {
		left = append(left, fmt.Sprintf("processes %v", pids))
	}
	for _, cg := range st.Cgroups {
		if d := cgroupDirs(cg); len(d) > 0 {
			left = append(left, fmt.Sprintf("cgroups %v", d))
		}
	}
	if st.Dir != "" {
		if m := mountsUnder(st.Dir); len(m) > 0 {
			left = append(left, fmt.Sprintf("mounts %v", m))
		}
	}
	return left
}

// mountsUnder lists the host mount points under dir.
func mountsUnder(dir string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return []string{err.Error()}
	}
	var ms []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir) {
			ms = append(ms, f[4])
		}
	}
	return ms
}

// downAll tears down every cluster whose state is under the temp dir
// (make e2e-down): clusters kept with E2E_KEEP=1 or left by a killed run.
func downAll() error {
	files, _ := filepath.Glob(filepath.Join(os.TempDir(), "membrane-e2e-*", "cluster.json"))
	var errs []error
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var st state
		if err := json.Unmarshal(data, &st); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f, err))
			continue
		}
		logf("tearing down %s (%d nodes)", st.Dir, len(st.Nodes))
		errs = append(errs, teardown(st))
	}
	return errors.Join(errs...)
}

// cgroupHierarchies lists the mounted cgroup hierarchies
// (/sys/fs/cgroup/<controller> on this cgroup v1 host).
func cgroupHierarchies() []string {
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	var hs []string
	for _, e := range ents {
		if e.IsDir() {
			hs = append(hs, filepath.Join("/sys/fs/cgroup", e.Name()))
		}
	}
	return hs
}

// hostNetNS and hostMntNS are this process's namespaces, read before any
// goroutine enters a cluster namespace (a locked goroutine that enters
// one may run on the main thread, which /proc/self then describes).
var hostNetNS, hostMntNS = mustReadlink("/proc/self/ns/net"), mustReadlink("/proc/self/ns/mnt")

func mustReadlink(p string) string {
	s, err := os.Readlink(p)
	if err != nil {
		return "unknown " + p
	}
	return s
}

// isHostNS reports whether ns (readlink of /proc/<pid>/ns/<kind>) is one
// of this test process's own namespaces, or of PID 1's: never the
// cluster's.
func isHostNS(ns string) bool {
	if strings.HasPrefix(hostNetNS, "unknown") || strings.HasPrefix(hostMntNS, "unknown") {
		return true // cannot tell: assume the worst
	}
	if ns == hostNetNS || ns == hostMntNS {
		return true
	}
	for _, kind := range []string{"net", "mnt"} {
		if own, err := os.Readlink("/proc/1/ns/" + kind); err == nil && own == ns {
			return true
		}
	}
	return false
}
