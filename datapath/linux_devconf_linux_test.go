package datapath

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"
)

// TestHostSysctlsByNetlink: hostSysctlsHold reads what /proc/sys holds
// (the netlink answer's IPv4 device configuration), says "look closer"
// for a value that differs, another name or a missing index, and
// Realize then writes the value through /proc/sys.
func TestHostSysctlsByNetlink(t *testing.T) {
	l, host, nl := newTestLinux(t, LinuxConfig{TeardownDelay: time.Hour})
	ep := addVeth(t, nl, 9, "lxctest0000009", "10.244.43.9")
	dir := "/proc/sys/net/ipv4/conf/" + ep.IfName + "/"
	for _, v := range []string{"1", "2", "0"} {
		writeSysctl(t, host, dir+"rp_filter", v)
		for key := range ipv4Devconf {
			want := map[string]string{key: readSysctl(t, host, dir+key)}
			if hold, err := l.hostSysctlsHold(ep.IfIndex, ep.IfName, want); err != nil || !hold {
				t.Fatalf("rp_filter %s: hostSysctlsHold(%v) = %v, %v; want true (what /proc/sys holds)", v, want, hold, err)
			}
			n, _ := strconv.Atoi(want[key])
			want[key] = strconv.Itoa(n + 1)
			if hold, err := l.hostSysctlsHold(ep.IfIndex, ep.IfName, want); err != nil || hold {
				t.Fatalf("hostSysctlsHold(%v) = %v, %v; want false (/proc/sys holds %d)", want, hold, err, n)
			}
		}
	}
	want := map[string]string{"rp_filter": "0"}
	if hold, err := l.hostSysctlsHold(ep.IfIndex, "lxcother000009", want); err != nil || hold {
		t.Fatalf("another name: hostSysctlsHold = %v, %v; want false", hold, err)
	}
	if hold, err := l.hostSysctlsHold(1<<30, ep.IfName, want); err != nil || hold {
		t.Fatalf("missing index: hostSysctlsHold = %v, %v; want false", hold, err)
	}

	// A value that differs is written on the way through /proc/sys.
	writeSysctl(t, host, dir+"rp_filter", "1")
	if _, err := l.Realize(context.Background(), ep, 1); err != nil {
		t.Fatalf("Realize: %v", err)
	}
	if got := readSysctl(t, host, dir+"rp_filter"); got != "0" {
		t.Fatalf("rp_filter after Realize = %s, want 0", got)
	}
	if hold, err := l.hostSysctlsHold(ep.IfIndex, ep.IfName, map[string]string{"rp_filter": "0", "forwarding": "1"}); err != nil || !hold {
		t.Fatalf("after Realize: hostSysctlsHold = %v, %v; want true", hold, err)
	}
}

func writeSysctl(t *testing.T, ns interface{ Do(func() error) error }, path, value string) {
	t.Helper()
	if err := ns.Do(func() error { return os.WriteFile(path, []byte(value), 0o644) }); err != nil {
		t.Fatal(err)
	}
}
