package datapath

import (
	"context"
	"fmt"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// BenchmarkIPCacheWrite: the Linux datapath's ipcache map write for one
// remote endpoint (issue 40: the kernel part of a remote update), on the
// real pinned LPM trie holding fill other entries: op=lifecycle is an
// endpoint arriving and leaving (UpsertIPCache of a new /32 with its
// node as tunnel endpoint, then DeleteIPCache), op=update is an
// existing entry changing identity. Reported: wall ns/op and the
// process's CPU ns/op (getrusage: the syscalls and the kernel's trie
// work).
//
//	go test -run '^$' -bench IPCacheWrite ./datapath/
func BenchmarkIPCacheWrite(b *testing.B) {
	for _, fill := range []int{0, 16000, 60000} {
		for _, op := range []string{"lifecycle", "update"} {
			b.Run(fmt.Sprintf("fill=%d/op=%s", fill, op), func(b *testing.B) {
				l, _, _ := newTestLinux(b, LinuxConfig{Maps: MapSizes{IPCacheMax: 1 << 17}})
				ctx := context.Background()
				node := netip.MustParseAddr("192.0.2.7")
				for i := range fill {
					if err := l.UpsertIPCache(ctx, benchPrefix(i), identity.NumericIdentity(256+i%500), node); err != nil {
						b.Fatal(err)
					}
				}
				// op=update rewrites the prefilled entries (or, at fill 0,
				// one entry); op=lifecycle adds and removes others.
				keys := max(fill, 1)
				if fill == 0 && op == "update" {
					if err := l.UpsertIPCache(ctx, benchPrefix(0), 256, node); err != nil {
						b.Fatal(err)
					}
				}
				b.ResetTimer()
				cpu0 := processCPU(b)
				for i := range b.N {
					switch op {
					case "lifecycle":
						p := benchPrefix(fill + i%4096)
						if err := l.UpsertIPCache(ctx, p, identity.NumericIdentity(256+i%500), node); err != nil {
							b.Fatal(err)
						}
						if err := l.DeleteIPCache(ctx, p); err != nil {
							b.Fatal(err)
						}
					case "update":
						if err := l.UpsertIPCache(ctx, benchPrefix(i%keys), identity.NumericIdentity(256+(i+1)%500), node); err != nil {
							b.Fatal(err)
						}
					}
				}
				cpu := processCPU(b) - cpu0
				b.StopTimer()
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
			})
		}
	}
}

// benchPrefix is the i-th /32 of 10.64.0.0/10.
func benchPrefix(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(64 + i>>16), byte(i >> 8), byte(i)}), 32)
}

// processCPU is the process's user+system CPU time.
func processCPU(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
