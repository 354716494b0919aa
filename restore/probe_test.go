package restore

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// BenchmarkFlushProbe times what each durable write costs the disk, the
// three ways interleaved (one of each per iteration, so they see the same
// load): a 700-byte record appended into a preallocated, already written
// file and fdatasync'ed (the journal: no metadata changes, no ext4
// journal commit); the same appended to a growing file (the size changes:
// fdatasync waits for a journal commit); and a small file rewritten in a
// directory followed by syncfs (the store before the journal: it waits
// for every dirty page on the filesystem, other processes' too). With
// MEMBRANE_BENCH_EXT4 set the files are on ext4 for certain
// (testutil.Ext4Dir). Reports p50/p99 of each.
func BenchmarkFlushProbe(b *testing.B) {
	dir := b.TempDir()
	if os.Getenv("MEMBRANE_BENCH_EXT4") != "" {
		dir = testutil.Ext4Dir(b)
	}
	const size = 16 << 20
	if err := writeZeros(dir, "prealloc", size); err != nil {
		b.Fatal(err)
	}
	open := func(name string, flags int) int {
		fd, err := unix.Open(filepath.Join(dir, name), unix.O_RDWR|unix.O_CLOEXEC|flags, 0o640)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	pre, grow := open("prealloc", 0), open("growing", unix.O_CREAT|unix.O_TRUNC)
	sd, err := openStateDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer sd.close()
	rec := make([]byte, 700)
	var hPre, hGrow, hSyncfs Hist
	timed := func(h *Hist, f func() error) {
		start := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		h.Add(time.Since(start))
	}
	var preOff, growOff int64
	for i := 0; b.Loop(); i++ {
		timed(&hPre, func() error {
			if preOff+int64(len(rec)) > size {
				preOff = 0
			}
			if err := pwriteAll(pre, rec, preOff); err != nil {
				return err
			}
			preOff += int64(len(rec))
			return fdatasync(pre)
		})
		timed(&hGrow, func() error {
			if err := pwriteAll(grow, rec, growOff); err != nil {
				return err
			}
			growOff += int64(len(rec))
			return fdatasync(grow)
		})
		timed(&hSyncfs, func() error {
			var p pathBuf
			if err := sd.writeFile(append(p[:0], fmt.Sprintf("f%d", i%64)...), rec, uint16(len(rec))); err != nil {
				return err
			}
			return unix.Syncfs(sd.fd)
		})
	}
	for _, m := range []struct {
		name string
		h    *Hist
	}{{"prealloc-fdatasync", &hPre}, {"growing-fdatasync", &hGrow}, {"syncfs", &hSyncfs}} {
		b.ReportMetric(float64(m.h.Quantile(0.5).Microseconds())/1000, m.name+"-p50-ms")
		b.ReportMetric(float64(m.h.Quantile(0.99).Microseconds())/1000, m.name+"-p99-ms")
	}
}
