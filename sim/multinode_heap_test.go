package sim

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// etcdBinary is etcd-embed from scripts/kube-bin.sh, found as
// test/kubetest finds it; without it the test is skipped, or fails under
// CI.
func etcdBinary(tb testing.TB) string {
	tb.Helper()
	bin := filepath.Join(kubetest.BinDir(), "etcd-embed")
	if fi, err := os.Stat(bin); err == nil && !fi.IsDir() {
		return bin
	}
	if testutil.InCI() {
		tb.Fatalf("%s missing and CI is set: run scripts/kube-bin.sh", bin)
	}
	tb.Skipf("%s missing (run scripts/kube-bin.sh)", bin)
	return ""
}

// BenchmarkRemoteEndpointHeap: one agent in kvstore mode (fake datapath)
// mirrors N endpoints another node published in etcd (MEMBRANE_REMOTE_N,
// default 10,000; etcd runs as its own process, so its memory is not
// counted). Reported is the agent's live heap growth per remote endpoint
// once all N are in its ipcache: the mirror's records, the ipcache
// actor's and the index's rows, and the fake datapath's map (which stands
// in for the BPF map: kernel memory on a real node). Run with
// -benchtime 1x; MEMBRANE_REMOTE_HEAPPROFILE=file writes the heap profile.
func BenchmarkRemoteEndpointHeap(b *testing.B) {
	n := 10000
	if s := os.Getenv("MEMBRANE_REMOTE_N"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 || n > 1<<20 {
			b.Fatalf("MEMBRANE_REMOTE_N=%q: want 1..%d", s, 1<<20)
		}
	}
	bin := etcdBinary(b)
	for range b.N {
		dir := b.TempDir()
		etcd, err := startSimEtcd(dir, bin)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(etcd.stop)
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.endpoint()}, DialTimeout: 5 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cli.Close() })
		a, err := agent.Start(agent.Config{Socket: filepath.Join(dir, "run", "a.sock"), StateDir: filepath.Join(dir, "state"),
			IPv4Range: podRange(0), Datapath: "fake", GCInterval: -1, Fake: datapath.NewFake(1),
			Kvstore:   &kvstore.Config{Endpoints: []string{etcd.endpoint()}, NodeName: "heap-a", Prefix: simPrefix},
			NodeAddrs: []netip.Addr{netip.AddrFrom4([4]byte{192, 168, 221, 1})}}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = a.Stop(context.Background()) })
		waitRemoteRows(b, a, 0)
		h0 := liveHeap()
		start := time.Now()
		putRemoteEndpoints(b, cli, n)
		waitRemoteRows(b, a, n)
		el := time.Since(start)
		h1 := liveHeap()
		if p := os.Getenv("MEMBRANE_REMOTE_HEAPPROFILE"); p != "" {
			writeHeap(b, p)
		}
		per := float64(int64(h1)-int64(h0)) / float64(n)
		b.ReportMetric(per, "heap-B/remote-endpoint")
		b.ReportMetric(el.Seconds(), "s-written-to-mirrored")
		b.Logf("%d remote endpoints: heap %d -> %d (%.0f B each), written and mirrored in %v; loadavg %s", n, h0, h1, per, el, loadavg())
	}
}

// putRemoteEndpoints writes node heap-b's record and n endpoint records
// of it as its publisher would (pkg/agent/kvstore's record format), 100
// per transaction.
func putRemoteEndpoints(b *testing.B, cli *clientv3.Client, n int) {
	b.Helper()
	var ops []clientv3.Op
	flush := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			b.Fatal(err)
		}
		ops = ops[:0]
	}
	// heap-b's node record: its pod CIDR holds the records' addresses
	// (heap-a believes no claim outside it).
	ops = append(ops, clientv3.OpPut(simPrefix+"state/nodes/v1/heap-b",
		`{"name":"heap-b","addrs":["192.168.221.2"],"podCIDRs":["10.64.0.0/10"]}`))
	for i := range n {
		ip := fmt.Sprintf("10.%d.%d.%d", 64+i>>16, (i>>8)&255, i&255)
		v := fmt.Sprintf(`{"ips":[%q],"identity":%d,"node":"heap-b","nodeIP":"192.168.221.2"}`, ip, 256+i%500)
		ops = append(ops, clientv3.OpPut(fmt.Sprintf("%sstate/endpoints/v1/heap-b/%d", simPrefix, i+1), v))
		if len(ops) == 100 {
			flush()
		}
	}
	if len(ops) > 0 {
		flush()
	}
}

// waitRemoteRows waits until the agent's ipcache holds n entries from the
// kvstore.
func waitRemoteRows(b *testing.B, a *agent.Agent, n int) {
	b.Helper()
	deadline := time.Now().Add(10 * time.Minute)
	for {
		rows := 0
		for _, e := range a.Index.IPCache() {
			if e.Source == index.SourceRemote {
				rows++
			}
		}
		if rows == n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("remote rows %d, want %d", rows, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func liveHeap() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func writeHeap(b *testing.B, path string) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}

func loadavg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(raw))[:3], " ")
}
