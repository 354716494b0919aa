package procmem

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
)

// exeRss sums the resident size (kB) of this process's read-only
// mappings of its own executable (/proc/self/smaps): what
// ReleaseExecutable advises. Other file mappings (a -race build's libc
// and loader) and the writable data are left out.
func exeRss(t *testing.T) uint64 {
	t.Helper()
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var total uint64
	mine := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if _, _, perms, path, ok := parseMapsLine(line); ok {
			mine = path == exe && !strings.Contains(perms, "w")
			continue
		}
		if v, ok := strings.CutPrefix(line, "Rss:"); ok && mine {
			n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			total += n
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return total
}

// touchExecutable reads every page of this process's read-only mappings
// of its executable (through /proc/self/mem).
func touchExecutable(t *testing.T) {
	t.Helper()
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	mem, err := os.Open("/proc/self/mem") // reading it faults the pages in
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	buf := make([]byte, 64<<10)
	for _, line := range strings.Split(string(b), "\n") {
		lo, hi, perms, path, ok := parseMapsLine(line)
		if !ok || path != exe || strings.Contains(perms, "w") || !strings.HasPrefix(perms, "r") {
			continue
		}
		for a := lo; a < hi; a += uint64(len(buf)) {
			n := min(uint64(len(buf)), hi-a)
			if _, err := mem.ReadAt(buf[:n], int64(a)); err != nil {
				t.Fatalf("read %x: %v", a, err)
			}
		}
	}
}

// TestReleaseExecutable: the test binary's resident pages of its own
// executable drop by at least a quarter of what was advised once
// released, and the process goes on running (the pages it needs come
// back on touch).
func TestReleaseExecutable(t *testing.T) {
	// Every page of the executable's read-only mappings resident first,
	// so that what the release drops is not hidden by the pages other
	// goroutines (the collector, the race detector's runtime) fault back
	// in meanwhile: at least a quarter of what was advised must go.
	touchExecutable(t)
	before := exeRss(t)
	r, err := ReleaseExecutable()
	if err != nil {
		t.Fatal(err)
	}
	after := exeRss(t)
	t.Logf("advised %d mappings, %d KiB; the executable's Rss %d -> %d KiB", r.Mappings, r.Bytes>>10, before, after)
	if r.Mappings == 0 || r.Bytes == 0 {
		t.Fatalf("advised nothing: %+v", r)
	}
	if after+uint64(r.Bytes>>10)/4 > before {
		t.Fatalf("the executable's Rss %d -> %d KiB of %d KiB advised: want a quarter of it gone", before, after, r.Bytes>>10)
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
