package k8s_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// BenchmarkRemoteEndpoints measures what other nodes' endpoint objects
// cost an agent: N MembraneEndpoints (MEMBRANE_REMOTE_N, default 10,000)
// of another node, spread over 10 namespaces. It reports the agent's live
// heap growth per remote endpoint once all of them are in its ipcache
// (index and fake datapath), and the time a fresh agent takes from Start
// until all N are in its ipcache. Run with -benchtime 1x.
func BenchmarkRemoteEndpoints(b *testing.B) {
	n := 10000
	if s := os.Getenv("MEMBRANE_REMOTE_N"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			b.Fatalf("MEMBRANE_REMOTE_N=%q: want a positive count", s)
		}
	}
	env := kubetest.Require(b)
	rc := rest.CopyConfig(env.Config)
	rc.QPS, rc.Burst = 2000, 4000
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		b.Fatal(err)
	}
	installEndpointCRD(b, dyn)
	cs, err := newClientset(env)
	if err != nil {
		b.Fatal(err)
	}
	// The node whose pod CIDR holds the objects' addresses (10.64.0.0 on).
	createNode(b, cs, "bench-b", []string{"10.64.0.0/10"}, "192.0.2.200")
	b.Logf("loadavg at start: %s", loadavg())
	var nss []string
	for i := range 10 {
		ns := fmt.Sprintf("bench-remote-%d", i)
		nss = append(nss, ns)
		_, _ = cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	}
	b.Cleanup(func() {
		for _, ns := range nss {
			_ = dyn.Resource(mepGVR).Namespace(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{},
				metav1.ListOptions{LabelSelector: v2.EndpointNodeLabel + "=bench-b"})
		}
	})

	for i := 0; i < b.N; i++ {
		a := startAgent(b, "bench-a", nil)
		waitRemote(b, a, 0)
		h0 := liveHeap()
		start := time.Now()
		createRemoteObjects(b, dyn, nss, n)
		b.Logf("created %d objects in %v", n, time.Since(start))
		waitRemote(b, a, n)
		h1 := liveHeap()
		writeHeapProfile(b)
		perEP := float64(int64(h1)-int64(h0)) / float64(n)
		a.stop()

		start = time.Now()
		fresh := startAgent(b, "bench-a", nil)
		waitRemote(b, fresh, n)
		syncTime := time.Since(start)
		fresh.stop()
		b.ReportMetric(perEP, "heap-B/remote-endpoint")
		b.ReportMetric(syncTime.Seconds(), "s-start-to-synced")
		b.Logf("remote endpoints %d: heap %d -> %d (%.0f B each); fresh agent start to all in the ipcache: %v", n, h0, h1, perEP, syncTime)
	}
	b.Logf("loadavg at end: %s", loadavg())
}

// waitRemote waits until n remote rows are in the agent's index and n
// remote prefixes in its fake datapath.
func waitRemote(b *testing.B, a *testAgent, n int) {
	b.Helper()
	deadline := time.Now().Add(10 * time.Minute)
	for {
		rows := 0
		for _, e := range a.a.Index.IPCache() {
			if e.Source == index.SourceRemote {
				rows++
			}
		}
		st, err := a.c.Status(context.Background())
		if err == nil && st.K8s != nil && st.K8s.RemoteEndpointsSynced && rows == n && len(a.fake.IPCache()) >= n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("remote rows %d, want %d", rows, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// createRemoteObjects creates n objects of node bench-b with 16 writers.
func createRemoteObjects(b *testing.B, dyn dynamic.Interface, nss []string, n int) {
	b.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	next := make(chan int)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				ns := nss[i%len(nss)]
				ip := fmt.Sprintf("10.%d.%d.%d", 64+i>>16, (i>>8)&255, i&255)
				u := mepObject(ns, fmt.Sprintf("ep-%05d", i), "bench-b", ip, int64(100000+i%500), "192.0.2.200")
				if _, err := dyn.Resource(mepGVR).Namespace(ns).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatalf("create objects: %v", err)
	default:
	}
}

// writeHeapProfile writes the heap profile to $MEMBRANE_REMOTE_HEAPPROFILE
// when set (go tool pprof -sample_index=inuse_space shows where the
// remote endpoints' bytes are).
func writeHeapProfile(b *testing.B) {
	path := os.Getenv("MEMBRANE_REMOTE_HEAPPROFILE")
	if path == "" {
		return
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		b.Fatal(err)
	}
}

// liveHeap is the heap in use after two collections.
func liveHeap() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func loadavg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(raw))
}
