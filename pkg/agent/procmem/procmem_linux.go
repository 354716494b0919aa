package procmem

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ReleaseExecutable advises the kernel to reclaim the resident pages of
// the running executable's read-only mappings (text, rodata, symbol
// tables: never written, so reclaiming loses nothing). Writable mappings
// (data, bss) are left alone. It needs Linux 5.4 (MADV_PAGEOUT); older
// kernels answer EINVAL, returned as the error.
func ReleaseExecutable() (Release, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return Release{}, fmt.Errorf("release executable pages: %w", err)
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return Release{}, fmt.Errorf("release executable pages: %w", err)
	}
	defer f.Close()
	type span struct{ lo, hi uint64 }
	var spans []span
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lo, hi, perms, path, ok := parseMapsLine(sc.Text())
		if !ok || path != exe || strings.Contains(perms, "w") {
			continue
		}
		spans = append(spans, span{lo, hi})
	}
	if err := sc.Err(); err != nil {
		return Release{}, fmt.Errorf("release executable pages: read maps: %w", err)
	}
	var r Release
	for _, s := range spans {
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, uintptr(s.lo), uintptr(s.hi-s.lo), unix.MADV_PAGEOUT); e != 0 {
			return r, fmt.Errorf("release executable pages: madvise(MADV_PAGEOUT) %#x-%#x: %w", s.lo, s.hi, e)
		}
		r.Mappings++
		r.Bytes += s.hi - s.lo
	}
	return r, nil
}

// parseMapsLine splits one /proc/<pid>/maps line: "lo-hi perms offset
// dev inode path".
func parseMapsLine(line string) (lo, hi uint64, perms, path string, ok bool) {
	fs := strings.Fields(line)
	if len(fs) < 6 {
		return 0, 0, "", "", false
	}
	l, h, found := strings.Cut(fs[0], "-")
	if !found {
		return 0, 0, "", "", false
	}
	var err1, err2 error
	lo, err1 = strconv.ParseUint(l, 16, 64)
	hi, err2 = strconv.ParseUint(h, 16, 64)
	if err1 != nil || err2 != nil || hi <= lo {
		return 0, 0, "", "", false
	}
	return lo, hi, fs[1], strings.Join(fs[5:], " "), true
}
