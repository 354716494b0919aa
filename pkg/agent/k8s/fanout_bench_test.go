package k8s_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// BenchmarkEndpointWatchFanout: what one MembraneEndpoint change costs
// the API server per node watching (issue 40, CRD mode). For each
// watcher count W in MEMBRANE_FANOUT_WATCHERS (default "1 5 10 20"), W
// watches of the MembraneEndpoints as agents open them (all namespaces,
// the other nodes' objects by label selector, bookmarks, JSON; each
// watcher its own TLS connection, as each node has) follow
// MEMBRANE_FANOUT_LIFECYCLES (default 500) objects of another node being
// created and deleted (8 writers), until every watcher has seen every
// change. Measured per W: the API server's and its etcd's CPU
// (/proc/<pid>/stat, less their idle rate measured before) per change,
// and the watch bytes (the response bodies) per change per watcher.
// Reported: the slopes over W, i.e. the API server CPU per change per
// watcher and the bytes per change per watcher, with the intercept (the
// write itself), and each point in the log. Run with -benchtime 1x.
//
//	go test -run '^$' -bench EndpointWatchFanout -benchtime 1x ./pkg/agent/k8s/
func BenchmarkEndpointWatchFanout(b *testing.B) {
	ws := []int{1, 5, 10, 20}
	if s := os.Getenv("MEMBRANE_FANOUT_WATCHERS"); s != "" {
		ws = nil
		for _, f := range strings.Fields(s) {
			w, err := strconv.Atoi(f)
			if err != nil || w < 1 {
				b.Fatalf("MEMBRANE_FANOUT_WATCHERS=%q: want positive counts", s)
			}
			ws = append(ws, w)
		}
	}
	lifecycles := 500
	if s := os.Getenv("MEMBRANE_FANOUT_LIFECYCLES"); s != "" {
		var err error
		if lifecycles, err = strconv.Atoi(s); err != nil || lifecycles < 1 {
			b.Fatalf("MEMBRANE_FANOUT_LIFECYCLES=%q: want a positive count", s)
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
	createNode(b, cs, "fan-src", []string{"10.64.0.0/10"}, "192.0.2.201")
	const ns = "bench-fanout"
	_, _ = cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	for range b.N {
		b.Logf("loadavg at start: %s", loadavg())
		var cpuXs, apiCPU, etcdCPU, bytesPer []float64
		for _, w := range ws {
			idleAPI, idleEtcd := idleRates(b, env.APIServerPID(), env.EtcdPID(), 2*time.Second)
			ctx, cancel := context.WithCancel(context.Background())
			watchers := make([]*fanoutWatcher, w)
			for i := range watchers {
				watchers[i] = startFanoutWatcher(ctx, b, env, fmt.Sprintf("fan-w-%d", i))
			}
			changes := 2 * lifecycles
			api0, etcd0 := procCPU(b, env.APIServerPID()), procCPU(b, env.EtcdPID())
			start := time.Now()
			churnObjects(b, dyn, ns, lifecycles)
			for _, fw := range watchers {
				fw.wait(b, changes)
			}
			el := time.Since(start)
			api, etcd := procCPU(b, env.APIServerPID())-api0, procCPU(b, env.EtcdPID())-etcd0
			cancel()
			var total int64
			for _, fw := range watchers {
				total += fw.bytes.Load()
			}
			apiPer := (api.Seconds() - idleAPI*el.Seconds()) * 1e6 / float64(changes)
			etcdPer := (etcd.Seconds() - idleEtcd*el.Seconds()) * 1e6 / float64(changes)
			bpw := float64(total) / float64(w) / float64(changes)
			cpuXs, apiCPU, etcdCPU, bytesPer = append(cpuXs, float64(w)), append(apiCPU, apiPer), append(etcdCPU, etcdPer), append(bytesPer, bpw)
			b.Logf("W %d: %d changes in %v; API server CPU %v (idle %.0f ms/s): %.0f µs per change; etcd %v: %.0f µs per change; %.0f watch bytes per change per watcher; loadavg %s",
				w, changes, el.Round(time.Millisecond), api, idleAPI*1000, apiPer, etcd, etcdPer, bpw, loadavg())
		}
		af, ef, bf := fitLine(cpuXs, apiCPU), fitLine(cpuXs, etcdCPU), fitLine(cpuXs, bytesPer)
		b.ReportMetric(af.slope, "apiserver-cpu-µs/change/watcher")
		b.ReportMetric(af.intercept, "apiserver-cpu-µs/change")
		b.ReportMetric(bf.intercept+bf.slope, "watch-B/change/watcher")
		b.Logf("API server CPU per change: %.0f µs + %.1f µs (±%.1f) per watcher; etcd %.0f µs + %.1f µs per watcher; watch bytes per change per watcher %.0f (slope over W %+.1f); loadavg at end %s",
			af.intercept, af.slope, af.stderr, ef.intercept, ef.slope, bf.intercept+bf.slope, bf.slope, loadavg())
	}
}

// fanoutWatcher is one watch as a node's agent opens it, counting the
// bytes and the ADDED and DELETED events it got.
type fanoutWatcher struct {
	bytes  atomic.Int64
	events atomic.Int64
	err    atomic.Pointer[error]
}

func startFanoutWatcher(ctx context.Context, b *testing.B, env *kubetest.Env, node string) *fanoutWatcher {
	b.Helper()
	tlsCfg, err := rest.TLSConfigFor(env.Config)
	if err != nil {
		b.Fatal(err)
	}
	// Its own transport: its own connection, as every node has.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg, ForceAttemptHTTP2: true}}
	// The current resource version: the watch starts now (no replay).
	lr, err := dynamic.NewForConfigOrDie(env.Config).Resource(mepGVR).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		b.Fatal(err)
	}
	q := url.Values{"watch": {"true"}, "allowWatchBookmarks": {"true"}, "resourceVersion": {lr.GetResourceVersion()},
		"labelSelector": {v2.EndpointNodeLabel + "," + v2.EndpointNodeLabel + "!=" + node}}
	u := fmt.Sprintf("%s/apis/%s/%s?%s", env.Config.Host, v2.GroupVersion.String(), v2.EndpointResource, q.Encode())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+env.Config.BearerToken)
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		b.Fatalf("watch: %s", resp.Status)
	}
	fw := &fanoutWatcher{}
	go func() {
		defer resp.Body.Close()
		defer hc.CloseIdleConnections()
		r := bufio.NewReaderSize(resp.Body, 64<<10)
		for {
			line, err := r.ReadBytes('\n')
			fw.bytes.Add(int64(len(line)))
			if bytes.HasPrefix(line, []byte(`{"type":"ADDED"`)) || bytes.HasPrefix(line, []byte(`{"type":"DELETED"`)) {
				fw.events.Add(1)
			}
			if err != nil {
				if ctx.Err() == nil {
					fw.err.Store(&err)
				}
				return
			}
		}
	}()
	return fw
}

// wait waits until the watcher saw n changes.
func (fw *fanoutWatcher) wait(b *testing.B, n int) {
	b.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for fw.events.Load() < int64(n) {
		if e := fw.err.Load(); e != nil {
			b.Fatalf("watch ended: %v", *e)
		}
		if time.Now().After(deadline) {
			b.Fatalf("watcher saw %d of %d changes", fw.events.Load(), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// churnObjects creates and deletes n objects of node fan-src with 8
// writers.
func churnObjects(b *testing.B, dyn dynamic.Interface, ns string, n int) {
	b.Helper()
	next := make(chan int)
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				name := fmt.Sprintf("fan-%06d", i)
				ip := fmt.Sprintf("10.%d.%d.%d", 64+i>>16, (i>>8)&255, i&255)
				res := dyn.Resource(mepGVR).Namespace(ns)
				_, err := res.Create(context.Background(), mepObject(ns, name, "fan-src", ip, int64(100000+i%500), "192.0.2.201"), metav1.CreateOptions{})
				if err == nil {
					err = res.Delete(context.Background(), name, metav1.DeleteOptions{})
				}
				if err != nil {
					failed.Store(&err)
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if e := failed.Load(); e != nil {
		b.Fatalf("churn: %v", *e)
	}
}

func procCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	if pid == 0 {
		b.Fatal("process not running")
	}
	d, err := testutil.ProcessCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// idleRates are the CPU seconds per second of processes p and q over d.
func idleRates(b *testing.B, p, q int, d time.Duration) (float64, float64) {
	p0, q0, start := procCPU(b, p), procCPU(b, q), time.Now()
	time.Sleep(d)
	el := time.Since(start).Seconds()
	return (procCPU(b, p) - p0).Seconds() / el, (procCPU(b, q) - q0).Seconds() / el
}

// line is a least-squares line.
type line struct{ slope, intercept, stderr float64 }

func fitLine(xs, ys []float64) line {
	n := float64(len(xs))
	if len(xs) < 2 {
		if len(ys) == 1 {
			return line{intercept: ys[0]}
		}
		return line{}
	}
	var sx, sy float64
	for i := range xs {
		sx, sy = sx+xs[i], sy+ys[i]
	}
	mx, my := sx/n, sy/n
	var sxx, sxy float64
	for i := range xs {
		sxx += (xs[i] - mx) * (xs[i] - mx)
		sxy += (xs[i] - mx) * (ys[i] - my)
	}
	if sxx == 0 {
		return line{intercept: my}
	}
	l := line{slope: sxy / sxx}
	l.intercept = my - l.slope*mx
	if n > 2 {
		var ss float64
		for i := range xs {
			r := ys[i] - (l.intercept + l.slope*xs[i])
			ss += r * r
		}
		l.stderr = math.Sqrt(ss / (n - 2) / sxx)
	}
	return l
}
