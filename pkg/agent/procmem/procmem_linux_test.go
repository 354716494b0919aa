package procmem

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
)

// rssFile reads this process's RssFile (kB).
func rssFile(t *testing.T) uint64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "RssFile:"); ok {
			n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

// TestReleaseExecutable: the test binary's resident file pages drop to
// less than half once released, and the process goes on running (the
// pages it needs come back on touch).
func TestReleaseExecutable(t *testing.T) {
	before := rssFile(t)
	r, err := ReleaseExecutable()
	if err != nil {
		t.Fatal(err)
	}
	after := rssFile(t)
	t.Logf("advised %d mappings, %d KiB; RssFile %d -> %d KiB", r.Mappings, r.Bytes>>10, before, after)
	if r.Mappings == 0 || r.Bytes == 0 {
		t.Fatalf("advised nothing: %+v", r)
	}
	if after*2 > before {
		t.Fatalf("RssFile %d -> %d KiB: want it at least halved", before, after)
	}
	// Code and read-only data still work after the release.
	if got := strconv.Itoa(12345) + strings.Repeat("x", 2); got != "12345xx" {
		t.Fatal(got)
	}
}

func TestParseMapsLine(t *testing.T) {
	lo, hi, perms, path, ok := parseMapsLine("00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/membrane agent")
	if !ok || lo != 0x400000 || hi != 0x452000 || perms != "r-xp" || path != "/usr/bin/membrane agent" {
		t.Fatalf("got %x %x %q %q %v", lo, hi, perms, path, ok)
	}
	for _, bad := range []string{"", "00400000-00452000 r-xp 0 08:02 0", "zz-00452000 r-xp 0 0 0 /x", "00452000-00400000 r-xp 0 0 0 /x", "00400000 r-xp 0 0 0 /x"} {
		if _, _, _, _, ok := parseMapsLine(bad); ok {
			t.Errorf("%q: parsed", bad)
		}
	}
}
