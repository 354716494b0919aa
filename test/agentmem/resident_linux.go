package agentmem

import (
	"bufio"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
)

// pageSize is the base page size pagemap reports in.
const pageSize = 4096

// Pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
const (
	pmPresent  = 1 << 63
	pmFileShrd = 1 << 61
)

// Resident is where a process's resident pages of its own executable
// are: per ELF section and per Go package (the symbols the page's bytes
// belong to), file-backed pages (RssFile) and copied-on-write ones
// (private anonymous, in RssAnon) apart.
type Resident struct {
	// File and COW are the executable's resident pages in bytes:
	// backed by the file (shared with the page cache) and written
	// (.data, .bss and .noptrbss pages, private copies).
	File, COW uint64
	// Sections are the file-backed resident bytes per section.
	Sections map[string]uint64
	// Packages are the file-backed resident bytes per Go package, by
	// the symbols overlapping each page, for the sections whose
	// symbols name their owner (.text, .rodata, .typelink, .itablink,
	// .noptrdata, .data); "(gap)" is bytes of those sections no
	// symbol covers.
	Packages map[string]uint64
}

// ReadResident walks /proc/<pid>/pagemap over the mappings of the
// process's executable and attributes each present page. It needs root
// for no bit it reads (present and file/shared are visible to the
// process's owner).
func ReadResident(pid int) (*Resident, error) {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return nil, fmt.Errorf("read resident: %w", err)
	}
	maps, err := exeMappings(pid, exe)
	if err != nil {
		return nil, err
	}
	pm, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return nil, fmt.Errorf("read resident: %w", err)
	}
	defer pm.Close()
	var filePages []uint64
	r := &Resident{Sections: map[string]uint64{}, Packages: map[string]uint64{}}
	for _, m := range maps {
		n := (m[1] - m[0]) / pageSize
		buf := make([]byte, 8*n)
		if _, err := pm.ReadAt(buf, int64(m[0]/pageSize*8)); err != nil && err != io.EOF {
			return nil, fmt.Errorf("read pagemap: %w", err)
		}
		for i := range n {
			e := binary.LittleEndian.Uint64(buf[8*i:])
			switch {
			case e&pmPresent == 0:
			case e&pmFileShrd != 0:
				r.File += pageSize
				filePages = append(filePages, m[0]+i*pageSize)
			default:
				r.COW += pageSize
			}
		}
	}
	f, err := elf.Open(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return nil, fmt.Errorf("read resident: %w", err)
	}
	defer f.Close()
	attribute(r, f, filePages)
	return r, nil
}

// exeMappings are the [start, end) ranges of the process's mappings of
// exe.
func exeMappings(pid int, exe string) ([][2]uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, fmt.Errorf("read maps: %w", err)
	}
	defer f.Close()
	var out [][2]uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[5] != exe {
			continue
		}
		lo, hi, _ := strings.Cut(fields[0], "-")
		a, err1 := strconv.ParseUint(lo, 16, 64)
		b, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("read maps: bad range %q", fields[0])
		}
		out = append(out, [2]uint64{a, b})
	}
	return out, sc.Err()
}

type sym struct {
	lo, hi uint64
	pkg    string
}

// attribute fills r.Sections and r.Packages from the resident file
// pages (sorted addresses) and the ELF sections and symbols of f (a
// non-PIE Go executable: addresses in the file are the mapped ones).
func attribute(r *Resident, f *elf.File, pages []uint64) {
	secs := make([]*elf.Section, 0, len(f.Sections))
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_ALLOC != 0 && s.Addr != 0 {
			secs = append(secs, s)
		}
	}
	sort.Slice(secs, func(i, j int) bool { return secs[i].Addr < secs[j].Addr })
	syms, _ := f.Symbols() // a stripped binary: sections only
	var ss []sym
	for _, s := range syms {
		if s.Size == 0 || elf.ST_TYPE(s.Info) == elf.STT_SECTION {
			continue
		}
		ss = append(ss, sym{s.Value, s.Value + s.Size, PackageOf(s.Name)})
	}
	sort.Slice(ss, func(i, j int) bool { return ss[i].lo < ss[j].lo })
	named := map[string]bool{".text": true, ".rodata": true, ".typelink": true, ".itablink": true, ".noptrdata": true, ".data": true}
	for _, p := range pages {
		for _, s := range secs {
			lo, hi := max(p, s.Addr), min(p+pageSize, s.Addr+s.Size)
			if lo >= hi {
				continue
			}
			r.Sections[s.Name] += hi - lo
			if !named[s.Name] {
				continue
			}
			covered := uint64(0)
			i := sort.Search(len(ss), func(i int) bool { return ss[i].hi > lo })
			for ; i < len(ss) && ss[i].lo < hi; i++ {
				a, b := max(lo, ss[i].lo), min(hi, ss[i].hi)
				if a < b {
					r.Packages[ss[i].pkg] += b - a
					covered += b - a
				}
			}
			if covered < hi-lo {
				r.Packages["(gap)"] += hi - lo - min(covered, hi-lo)
			}
		}
	}
}

// PackageOf is the Go package a linker symbol belongs to:
// "k8s.io/api/core/v1" for "k8s.io/api/core/v1.(*Pod).Marshal",
// "type:*k8s.io/api/core/v1.Pod" and "go:itab.*k8s.io/...,..." alike;
// linker-made symbols without one (go:string.*, runtime.pclntab's
// neighbours) keep their name.
func PackageOf(name string) string {
	for _, p := range []string{"type:.eq.", "type:.hash.", "type:", "go:itab.", "go:map.init.", "go:"} {
		if strings.HasPrefix(name, p) {
			rest := strings.TrimLeft(strings.TrimPrefix(name, p), "*[]0123456789")
			if p == "go:" && !strings.Contains(rest, "/") && !strings.Contains(rest, ".") {
				return name
			}
			name = rest
			if p == "go:" {
				return "go:" + strings.SplitN(rest, ".", 2)[0]
			}
			break
		}
	}
	if strings.HasPrefix(name, "map[") || strings.HasPrefix(name, "func(") || strings.HasPrefix(name, "struct {") ||
		strings.HasPrefix(name, "noalg.") || strings.HasPrefix(name, "interface {") || strings.HasPrefix(name, "chan ") {
		return "(composite types)"
	}
	slash := strings.LastIndex(name, "/")
	dot := strings.Index(name[slash+1:], ".")
	if dot < 0 {
		return name
	}
	return name[:slash+1+dot]
}
