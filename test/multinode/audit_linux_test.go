package multinode

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// annotateAudit sets (v "enabled") or removes (v "null") the audit
// annotation of a Node (ns "") or pod.
func annotateAudit(t *testing.T, cs kubernetes.Interface, ns, name, v string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%s}}}`, k8s.AuditAnnotation, v)
	var err error
	if ns == "" {
		_, err = cs.CoreV1().Nodes().Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	} else {
		_, err = cs.CoreV1().Pods(ns).Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestHostPolicyAudit: the node's audit annotation puts the host
// endpoint in audit mode: what its host policy would drop passes (both
// families, from outside and from a local pod), counted under the host
// endpoint as policy-audit; removing the annotation enforces again.
func TestHostPolicyAudit(t *testing.T) {
	testutil.RequireRoot(t)
	env := kubetest.StartOwn(t)
	env.InstallCRDs(t)
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	h := newHostFWNode(t, env, cs, "hostfw-f", map[string]string{"role": "edge"}, "10.236.5.0/24", "192.168.240")
	pod := h.node.AddPod("audit-client")
	for _, port := range []int{7001, 7002} {
		testutil.EchoServer(t, h.node.NS, h.addr, port)
		testutil.EchoServer(t, h.node.NS, h.addr6, port)
	}
	subnet := netip.PrefixFrom(h.out, 24).Masked().Addr()
	subnet6 := netip.PrefixFrom(h.out6, 64).Masked().Addr()
	applyPolicy(t, env, fmt.Sprintf(hostAllow, subnet, subnet6))
	h.waitReach(t, "enforced: 7002 dropped", map[int]bool{7001: true, 7002: false})
	podReach := func(port int) bool { return testutil.Exchange(pod.NS, h.addr, port, hostProbeTimeout) == nil }
	testutil.Eventually(t, "enforced: the pod does not reach the host", func() bool { return !podReach(7001) })

	annotateAudit(t, cs, "", h.name, `"enabled"`)
	h.waitReach(t, "audit mode: 7002 passes", map[int]bool{7001: true, 7002: true})
	h.waitReach6(t, "audit mode: 7002 passes (IPv6)", map[int]bool{7001: true, 7002: true})
	testutil.Eventually(t, "audit mode: the pod reaches the host", func() bool { return podReach(7001) })
	if n := h.hostDrops(t, datapath.DropPolicyAudit, "ingress"); n == 0 {
		t.Errorf("audit mode: no %s ingress counted under the host endpoint", datapath.DropPolicyAudit)
	}
	dropped := h.hostDrops(t, datapath.DropPolicy, "ingress")
	for range 3 {
		if !h.reach(7002) {
			t.Fatal("audit mode: 7002 dropped")
		}
	}
	if n := h.hostDrops(t, datapath.DropPolicy, "ingress"); n != dropped {
		t.Errorf("audit mode: %s ingress drops went from %d to %d", datapath.DropPolicy, dropped, n)
	}

	annotateAudit(t, cs, "", h.name, "null")
	h.waitReach(t, "annotation removed: enforced again", map[int]bool{7001: true, 7002: false})
}

// auditFlag reads the audit flag of endpoint id's entry in the node's
// pinned endpoints map (what the programs obey).
func (h *hostFWNode) auditFlag(t *testing.T, id int64) bool {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(h.node.BPFFS, "endpoints_by_ifindex"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var k uint32
	var v bpf.EndpointEndpointInfo
	it := m.Iterate()
	for it.Next(&k, &v) {
		if int64(v.Id) == id && k != 0 {
			return v.Flags&4 != 0 // ENDPOINT_F_AUDIT
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	t.Fatalf("endpoint %d has no entry in endpoints_by_ifindex", id)
	return false
}

// TestAuditModeAcrossRestart: a pod's audit mode (its annotation) is in
// the endpoint's state on disk: after a SIGKILL, an agent that cannot
// reach the API server (so nothing reads the annotation again) restores
// the endpoint in audit mode, in GET /v1/endpoint and in the kernel.
func TestAuditModeAcrossRestart(t *testing.T) {
	testutil.RequireRoot(t)
	env := kubetest.StartOwn(t)
	env.InstallCRDs(t)
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	h := newHostFWNode(t, env, cs, "hostfw-g", map[string]string{"role": "any"}, "10.236.6.0/24", "192.168.241")
	kpod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "audited",
		Annotations: map[string]string{k8s.AuditAnnotation: "enabled"}},
		Spec: corev1.PodSpec{NodeName: h.name, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause"}}}}
	if _, err := cs.CoreV1().Pods("default").Create(context.Background(), kpod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.CoreV1().Pods("default").Delete(context.Background(), "audited", metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	})
	pod := h.node.AddPod("audited")
	find := func() *models.Endpoint {
		t.Helper()
		eps, err := h.c.EndpointList(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, ep := range eps {
			if ep.K8sPodName == "audited" {
				return ep
			}
		}
		t.Fatalf("no endpoint for pod default/audited (%s)", pod.IPv4)
		return nil
	}
	testutil.Eventually(t, "the pod's audit annotation applied", func() bool { return find().PolicyAuditMode })
	id := find().ID
	if !h.auditFlag(t, id) {
		t.Fatal("audit mode in the API but not in the kernel's entry")
	}

	// SIGKILL, then an agent whose API server is unreachable.
	h.proc.Kill()
	kc, err := clientcmd.LoadFromFile(env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range kc.Clusters {
		c.Server = "https://127.0.0.1:9" // nothing listens
	}
	dead := filepath.Join(h.node.Dir, "kubeconfig-dead")
	if err := clientcmd.WriteToFile(*kc, dead); err != nil {
		t.Fatal(err)
	}
	for i, a := range h.proc.Args {
		if a == "--k8s-kubeconfig" {
			h.proc.Args[i+1] = dead
		}
	}
	h.proc.Args = append(h.proc.Args, "--k8s-sync-timeout", "2s")
	h.proc.Start()
	ep := find()
	if ep.ID != id || !ep.PolicyAuditMode {
		t.Fatalf("restored endpoint %d: policy-audit-mode %v, want endpoint %d in audit mode", ep.ID, ep.PolicyAuditMode, id)
	}
	if !h.auditFlag(t, id) {
		t.Fatal("restored endpoint: audit mode lost in the kernel's entry")
	}
}
