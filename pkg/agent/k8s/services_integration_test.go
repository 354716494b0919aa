package k8s_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

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

// TestServicesFromAPIServer: a Service and its EndpointSlice created
// through the real API server reach the service table and the Linux
// datapath's BPF maps (kube-proxy replacement mode: the NodePort on the
// Node's address too); a slice change and the Service's deletion follow.
// The datapath runs the mode's hooks (socket programs on a cgroup of the
// test's, the uplink program on the device holding the node's address):
// the NodePort frontend is flagged for the uplinks, the backends that
// name this node as local.
func TestServicesFromAPIServer(t *testing.T) {
	env := kubetest.Require(t)
	testutil.RequireRoot(t)
	host := testutil.NewNS(t, "mbt-svck8s")
	nodeIP := netip.MustParseAddr("192.0.2.77")
	hnl := host.Netlink(t)
	up := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "mbt_up"}} // a port-less bridge: no dummy driver here
	if err := errors.Join(hnl.LinkAdd(up), hnl.AddrAdd(up, &netlink.Addr{IPNet: &net.IPNet{IP: nodeIP.AsSlice(), Mask: net.CIDRMask(24, 32)}}), hnl.LinkSetUp(up)); err != nil {
		t.Fatal(err)
	}
	cg := testutil.Cgroup2Dir(t)
	dir := t.TempDir()
	node := "node-svc-" + testutil.RandomSuffix(6)
	cfg := agent.Config{
		Socket: filepath.Join(dir, "a.sock"), StateDir: filepath.Join(dir, "state"),
		IPv4Range: netip.MustParsePrefix("10.205.0.0/24"), Datapath: "linux",
		Linux: datapath.LinuxConfig{HostNetns: host.Path, BPFFS: testutil.BPFFSDir(t),
			Services: datapath.ServicesConfig{KubeProxyReplacement: true, Cgroup: cg}},
		K8s: &k8s.Config{Kubeconfig: env.Kubeconfig, NodeName: node, SyncTimeout: 20 * time.Second, KubeProxyReplacement: true},
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, err := agent.Start(cfg, slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatalf("agent.Start: %v", err)
	}
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer scancel()
		if err := a.Stop(sctx); err != nil {
			t.Errorf("agent stop: %v", err)
		}
	})
	// The Node after the agent: its addresses reach the NodePort
	// frontends through the Node informer's update.
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: nodeIP.String()}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	ns := "svc-" + testutil.RandomSuffix(6)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })

	svc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "db"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "db"},
			Ports: []corev1.ServicePort{{Name: "sql", Port: 5432, Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddr(svc.Spec.ClusterIP)
	nodePort := uint16(svc.Spec.Ports[0].NodePort)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "db-1", Labels: map[string]string{discoveryv1.LabelServiceName: "db"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptrTo("sql"), Port: ptrTo[int32](15432), Protocol: ptrTo(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.205.0.10"}, Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(true)}, NodeName: ptrTo(node)},
			{Addresses: []string{"10.205.0.11"}, Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(true)}, NodeName: ptrTo(node)},
			{Addresses: []string{"10.205.0.12"}, Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(false)}, NodeName: ptrTo(node)},
		},
	}
	if slice, err = cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cluster := service.Frontend{Addr: vip, Port: 5432, Proto: service.TCP}
	np := service.Frontend{Addr: nodeIP, Port: nodePort, Proto: service.TCP}
	want := []string{"10.205.0.10:15432", "10.205.0.11:15432"}
	waitMaps(t, a, "the service's two ready backends", []netip.Addr{vip, nodeIP}, map[service.Frontend][]string{cluster: want, np: want})
	m, err := a.System.DumpServiceMaps(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, fe := range m.Frontends {
		if (fe.Frontend == np) != fe.External && (fe.Frontend == np || fe.Frontend == cluster) {
			t.Errorf("frontend %s external %v, want only the NodePort", fe.Frontend, fe.External)
		}
	}
	for _, b := range m.Backends {
		if strings.HasPrefix(b.Backend.Addr.String(), "10.205.0.") && !b.Backend.Local {
			t.Errorf("backend %s of this node not flagged local", b.Backend)
		}
	}
	if h := m.Hooks; !h.KubeProxyReplacement || h.Cgroup != cg || !slices.Equal(h.Devices, []string{"mbt_up"}) {
		t.Errorf("hooks %+v, want the test's cgroup and mbt_up", h)
	}
	// The row turns realized when the services actor hears the write
	// finished, just after the maps hold it.
	var row *index.ServiceRow
	deadline := time.Now().Add(30 * time.Second)
	for ok := false; time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if row, ok = a.Index.Service(cluster); ok && row.State == index.ServiceRealized {
			break
		}
	}
	if row == nil || row.State != index.ServiceRealized || row.Source != k8s.ServiceSource || row.Service.Name != ns+"/db" || row.Service.PortName != "sql" {
		t.Errorf("service table row = %+v", row)
	}

	slice.Endpoints = slice.Endpoints[1:]
	if _, err := cs.DiscoveryV1().EndpointSlices(ns).Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitMaps(t, a, "a backend removed from the slice", []netip.Addr{vip, nodeIP}, map[service.Frontend][]string{cluster: want[1:], np: want[1:]})

	if err := cs.CoreV1().Services(ns).Delete(ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitMaps(t, a, "the service deleted", []netip.Addr{vip, nodeIP}, map[service.Frontend][]string{})
}

// waitMaps waits (bounded) until the BPF service maps hold exactly want
// among the frontends on addrs (the API server's own "kubernetes"
// Service is there too): each frontend with its backends.
func waitMaps(t *testing.T, a *agent.Agent, what string, addrs []netip.Addr, want map[service.Frontend][]string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last datapath.LBMaps
	for time.Now().Before(deadline) {
		m, err := a.System.DumpServiceMaps(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		m.Frontends = slices.DeleteFunc(m.Frontends, func(fe datapath.LBFrontendEntry) bool { return !slices.Contains(addrs, fe.Frontend.Addr) })
		last = m
		if mapsHold(m, want) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: the maps hold %+v, want %v", what, last, want)
}

func mapsHold(m datapath.LBMaps, want map[service.Frontend][]string) bool {
	if len(m.Frontends) != len(want) {
		return false
	}
	for _, fe := range m.Frontends {
		w, ok := want[fe.Frontend]
		if !ok || int(fe.Count) != len(w) {
			return false
		}
		var got []string
		for _, b := range m.Backends {
			if b.ID == fe.ID {
				got = append(got, b.Backend.String())
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, w) {
			return false
		}
	}
	return true
}

func ptrTo[T any](v T) *T { return &v }

// testWriter sends the agent's warnings to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
