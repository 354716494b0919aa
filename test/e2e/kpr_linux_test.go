//go:build linux

package e2e

import (
	"bufio"
	"os"
	"slices"
	"strings"
)

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
