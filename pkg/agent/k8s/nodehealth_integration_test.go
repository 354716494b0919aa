package k8s_test

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// annotateNode merge-patches node's annotations (as the cluster admin).
func annotateNode(t *testing.T, k *testAgent, node string, ann map[string]any) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.cs.CoreV1().Nodes().Patch(k.ctx, node, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestNodeHealthAnnotations: the agent publishes its health endpoint's
// address in its own Node's annotation, and believes another node's only
// inside that Node's spec.podCIDRs. Through a real kube-apiserver: node
// y's annotation names an address of its own pod CIDR (identity health
// in the ipcache, source node); x's names y's pod, z's its own node
// address and w's an address of this node's range: each refused (not
// health in the ipcache), logged and counted as
// membrane_remote_claims_refused_total{source="k8s",
// reason="health-outside-node-cidrs"}. y's annotation removed: its
// address leaves the ipcache.
func TestNodeHealthAnnotations(t *testing.T) {
	const self = "hann-self"
	k := startAgent(t, self, func(c *agent.Config) { c.IPv4Range = netip.MustParsePrefix("10.236.0.0/24") })
	createNode(t, k.cs, self, []string{"10.236.0.0/24"}, "192.0.2.90")

	// The health endpoint (the fake datapath runs none: made here as
	// pkg/agent/health makes it) shows in the Node's annotation.
	alloc, err := k.a.System.AllocateIP(k.ctx, ipam.IPv4, "membrane/membrane-health")
	if err != nil {
		t.Fatal(err)
	}
	ls, err := labels.ParseSet([]string{"reserved:health"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.a.System.CreateEndpoint(k.ctx, &endpoint.Endpoint{ContainerID: "membrane-health", Namespace: "membrane", PodName: "membrane-health",
		Labels: ls, IPv4: alloc.IPv4, IfName: "lxc_health", Netns: "/var/run/netns/health"}, true); err != nil {
		t.Fatal(err)
	}
	k.eventually(t, "this node's health address annotated", func() (bool, string) {
		n, err := k.cs.CoreV1().Nodes().Get(k.ctx, self, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return n.Annotations[k8s.HealthIPv4Annotation] == alloc.IPv4.String(), fmt.Sprintf("annotations %v, want %s", n.Annotations, alloc.IPv4)
	})

	before := refusedClaims(t, k.a, k8s.NodeSource, endpoint.RefusedHealthOutsideNode)
	createNode(t, k.cs, "hann-y", []string{"10.236.1.0/24"}, "192.0.2.91")
	createNode(t, k.cs, "hann-x", []string{"10.236.2.0/24"}, "192.0.2.92")
	createNode(t, k.cs, "hann-z", []string{"10.236.3.0/24"}, "192.0.2.93")
	createNode(t, k.cs, "hann-w", []string{"10.236.0.0/23"}, "192.0.2.94")
	annotateNode(t, k, "hann-x", map[string]any{k8s.HealthIPv4Annotation: "10.236.1.9"})  // y's pod
	annotateNode(t, k, "hann-z", map[string]any{k8s.HealthIPv4Annotation: "192.0.2.93"})  // its own node address
	annotateNode(t, k, "hann-w", map[string]any{k8s.HealthIPv4Annotation: "10.236.0.77"}) // this node's range
	annotateNode(t, k, "hann-y", map[string]any{k8s.HealthIPv4Annotation: "10.236.1.7"})  // its own: believed
	k.eventually(t, "y's health address is health", func() (bool, string) {
		id, src := apiIPCache(t, k, "10.236.1.7")
		return id == uint32(identity.ReservedHealth) && src == index.SourceNode && k.fake.IPCache()[netip.MustParsePrefix("10.236.1.7/32")] == identity.ReservedHealth,
			fmt.Sprintf("api %d %s", id, src)
	})
	k.eventually(t, "three refusals counted", func() (bool, string) {
		got := refusedClaims(t, k.a, k8s.NodeSource, endpoint.RefusedHealthOutsideNode) - before
		return got == 3, fmt.Sprintf("refused %v", got)
	})
	for ip, attack := range map[string]string{"10.236.1.9": "another node's pod", "192.0.2.93": "its node address", "10.236.0.77": "this node's range"} {
		if id, _ := apiIPCache(t, k, ip); id == uint32(identity.ReservedHealth) {
			t.Errorf("forged health address (%s) %s entered the ipcache as health", attack, ip)
		}
		if k.fake.IPCache()[netip.MustParsePrefix(ip+"/32")] == identity.ReservedHealth {
			t.Errorf("forged health address (%s) %s is health in the datapath", attack, ip)
		}
	}
	annotateNode(t, k, "hann-y", map[string]any{k8s.HealthIPv4Annotation: nil})
	k.eventually(t, "y's health address gone", func() (bool, string) {
		id, src := apiIPCache(t, k, "10.236.1.7")
		return id == 0, fmt.Sprintf("api %d %s", id, src)
	})
}
