package k8s_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/service"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// TestServiceMapUpdateBenchmark measures the time from an EndpointSlice
// update acknowledged by the API server to the service table row holding
// the new backend in state realized (set only after the BPF map write),
// with 1,000 Services on the Linux datapath. Numbers in BENCHMARKS.md.
// MEMBRANE_BENCH_DATAPATH=fake runs it on the fake datapath. Runs only
// with MEMBRANE_BENCH_SERVICES=1:
//
//	MEMBRANE_BENCH_SERVICES=1 go test -count=1 -v -run TestServiceMapUpdateBenchmark ./pkg/agent/k8s/
func TestServiceMapUpdateBenchmark(t *testing.T) {
	if os.Getenv("MEMBRANE_BENCH_SERVICES") == "" {
		t.Skip("a benchmark: set MEMBRANE_BENCH_SERVICES=1")
	}
	env := kubetest.Require(t)
	testutil.RequireRoot(t)
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	ns := "bench-" + testutil.RandomSuffix(6)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	const services, updates = 1000, 200
	vips := make([]netip.Addr, services)
	for i := range services {
		svc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s%d", i)},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		vips[i] = netip.MustParseAddr(svc.Spec.ClusterIP)
		if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, benchSlice(i, 1), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	host := testutil.NewNS(t, "mbt-svcbench")
	dir := t.TempDir()
	cfg := agent.Config{
		Socket: filepath.Join(dir, "a.sock"), StateDir: filepath.Join(dir, "state"),
		IPv4Range: netip.MustParsePrefix("10.206.0.0/16"), Datapath: "linux",
		Linux: datapath.LinuxConfig{HostNetns: host.Path, BPFFS: testutil.BPFFSDir(t)},
		K8s:   &k8s.Config{REST: env.Config, NodeName: "node-bench", SyncTimeout: time.Minute},
	}
	if os.Getenv("MEMBRANE_BENCH_DATAPATH") == "fake" {
		cfg.Datapath, cfg.Linux, cfg.Fake = "fake", datapath.LinuxConfig{}, datapath.NewFake(1)
	}
	start := time.Now()
	a, err := agent.Start(cfg, slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	waitRow(t, a, vips[services-1], 1)
	t.Logf("agent start to %d services in the maps: %v", services, time.Since(start))
	var took []time.Duration
	for u := range updates {
		i := (u * 7) % services
		start := time.Now()
		if _, err := cs.DiscoveryV1().EndpointSlices(ns).Update(ctx, benchSlice(i, 2+u), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitRow(t, a, vips[i], 2+u)
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	m, err := a.System.DumpServiceMaps(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile("/proc/loadavg")
	t.Logf("%s datapath: EndpointSlice update -> map written, %d updates over %d services (maps: %d frontends): p50 %v p90 %v p99 %v max %v; load average %s",
		a.System.Datapath.Name(), updates, services, len(m.Frontends), took[len(took)/2], took[len(took)*9/10], took[len(took)*99/100], took[len(took)-1], b)
}

// benchSlice is service i's slice with n backends 10.206.x.y:8080.
func benchSlice(i, n int) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: fmt.Sprintf("s%d", i), Labels: map[string]string{discoveryv1.LabelServiceName: fmt.Sprintf("s%d", i)}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptrTo("http"), Port: ptrTo[int32](8080), Protocol: ptrTo(corev1.ProtocolTCP)}},
	}
	for j := range n%8 + 1 {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.206.%d.%d", j, n%250+1)}})
	}
	return s
}

// waitRow waits until vip's row is realized with benchSlice(_, n)'s backends.
func waitRow(t *testing.T, a *agent.Agent, vip netip.Addr, n int) {
	t.Helper()
	f := service.Frontend{Addr: vip, Port: 80, Proto: service.TCP}
	want := fmt.Sprintf("10.206.0.%d:8080", n%250+1)
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if r, ok := a.Index.Service(f); ok && r.State == index.ServiceRealized && len(r.Service.Backends) == n%8+1 && r.Service.Backends[0].String() == want {
			return
		}
		time.Sleep(200 * time.Microsecond)
	}
	t.Fatalf("service %s not realized with %d backends", f, n%8+1)
}
