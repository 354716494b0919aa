// Package sysctl reads and writes kernel parameters under /proc/sys.
// Network parameters (net/...) belong to the network namespace of the
// calling thread, so callers enter a namespace on a locked thread first.
//
// The root is process-wide: a containerised agent finds the container's
// /proc/sys read-only and is given the host's /proc/sys/net mounted at
// <procfs>/sys/net instead (membrane-agent --procfs, as Cilium's agent
// does), which still resolves per calling thread's network namespace.
package sysctl

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
)

var root atomic.Pointer[string]

// SetProcFS makes every later call use procfs (e.g. /host/proc) instead
// of /proc. Only a program's main calls it, before any datapath work.
func SetProcFS(procfs string) {
	r := filepath.Join(filepath.Clean(procfs), "sys")
	root.Store(&r)
}

// Path returns the file of parameter name ("net/ipv4/conf/all/forwarding").
func Path(name string) string {
	if r := root.Load(); r != nil {
		return filepath.Join(*r, name)
	}
	return filepath.Join("/proc/sys", name)
}

// Ensure sets parameter name to value unless it holds that already (a
// read is cheaper than a write and needs no write access when nothing
// changes).
func Ensure(name, value string) error {
	path := Path(name)
	cur, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("sysctl %s: %w", path, err)
	}
	if strings.TrimSpace(string(cur)) == value {
		return nil
	}
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s: %w", path, err)
	}
	return nil
}
