package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	"github.com/membrane-cni/membrane/test/kubetest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	kubetest.RemoveChartTool()
	os.Exit(code)
}

// The DaemonSet's agent command, with the ConfigMap's values and the
// downward API's node name substituted as the kubelet does, is a valid
// membrane-agent command line in Kubernetes mode with --ipam kubernetes.
func TestDaemonSetFlagsParse(t *testing.T) {
	b, err := os.ReadFile("../../deploy/kubernetes/membrane.yaml")
	if err != nil {
		t.Fatal(err)
	}
	args := daemonSetArgs(t, b)
	cfg, _, err := parseFlags(args, io.Discard)
	if err != nil {
		t.Fatalf("membrane-agent %v: %v", args, err)
	}
	if cfg.K8s == nil || !cfg.K8s.InCluster || cfg.K8s.NodeName != "node-1" || cfg.IPAM != agent.IPAMKubernetes || cfg.Datapath != "linux" {
		t.Fatalf("config from the DaemonSet = k8s %+v ipam %q datapath %q", cfg.K8s, cfg.IPAM, cfg.Datapath)
	}
}

// daemonSetArgs is the agent container's command line in a YAML stream
// holding the ConfigMap and the DaemonSet, with the ConfigMap's values and
// the downward API's node name (node-1) substituted as the kubelet does.
func daemonSetArgs(t *testing.T, b []byte) []string {
	t.Helper()
	var (
		cm *corev1.ConfigMap
		ds *appsv1.DaemonSet
	)
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var raw map[string]any
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		doc, err := json.Marshal(raw)
		if err != nil {
			t.Fatal(err)
		}
		switch raw["kind"] {
		case "ConfigMap":
			cm = &corev1.ConfigMap{}
			err = json.Unmarshal(doc, cm)
		case "DaemonSet":
			ds = &appsv1.DaemonSet{}
			err = json.Unmarshal(doc, ds)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if cm == nil || ds == nil {
		t.Fatal("membrane.yaml: no ConfigMap or DaemonSet")
	}
	c := ds.Spec.Template.Spec.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil:
			v, ok := cm.Data[e.ValueFrom.ConfigMapKeyRef.Key]
			if !ok || e.ValueFrom.ConfigMapKeyRef.Name != cm.Name {
				t.Fatalf("env %s: ConfigMap %s has no key %s", e.Name, e.ValueFrom.ConfigMapKeyRef.Name, e.ValueFrom.ConfigMapKeyRef.Key)
			}
			env[e.Name] = v
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			env[e.Name] = "node-1"
		default:
			env[e.Name] = e.Value
		}
	}
	ref := regexp.MustCompile(`\$\(([A-Z0-9_]+)\)`)
	var args []string
	for _, a := range c.Command[1:] {
		args = append(args, ref.ReplaceAllStringFunc(a, func(m string) string {
			name := ref.FindStringSubmatch(m)[1]
			v, ok := env[name]
			if !ok {
				t.Fatalf("%s: $(%s) is not in the container's env", a, name)
			}
			return v
		}))
	}
	return args
}

// TestChartValuesParse: for each mode the Helm chart offers, the agent
// command its rendering (the Helm Go SDK, tools/chart) gives the
// DaemonSet parses, and the value reaches the agent's configuration.
func TestChartValuesParse(t *testing.T) {
	for _, tc := range []struct {
		sets  []string
		check func(cfg agent.Config) bool
	}{
		{nil, func(c agent.Config) bool {
			n := c.Linux.Nodes
			return n.Masquerade && n.Routing == datapath.RoutingTunnel && len(n.ClusterCIDRs) == 0 && c.DNSProxy == nil &&
				c.Linux.L7.ProxyPath == "" && c.Kvstore == nil && c.K8s.Identity.Mode == k8s.IdentityCRD && !c.K8s.KubeProxyReplacement &&
				c.K8s.APIServer == "" && c.IPAM == agent.IPAMKubernetes
		}},
		{[]string{"routingMode=native", "tunnelPort=4789", "tunnelMTU=8950"}, func(c agent.Config) bool {
			n := c.Linux.Nodes
			return n.Routing == datapath.RoutingNative && n.TunnelPort == 4789 && n.TunnelMTU == 8950
		}},
		{[]string{"masquerade=false", "clusterCIDRs={10.244.0.0/16,fd00:10::/56}"}, func(c agent.Config) bool {
			n := c.Linux.Nodes
			return !n.Masquerade && len(n.ClusterCIDRs) == 2 && n.ClusterCIDRs[1] == netip.MustParsePrefix("fd00:10::/56")
		}},
		{[]string{"kubeProxyReplacement=true", "k8sServiceHost=10.0.0.1", "k8sServicePort=443", "devices={eth0}"}, func(c agent.Config) bool {
			return c.K8s.KubeProxyReplacement && c.Linux.Services.KubeProxyReplacement && c.K8s.APIServer == "https://10.0.0.1:443" &&
				c.Linux.Services.Cgroup == "/run/membrane/cgroupv2" && len(c.Linux.Services.Devices) == 1
		}},
		{[]string{"l7Proxy=true"}, func(c agent.Config) bool { return c.Linux.L7.ProxyPath == "/usr/local/bin/membrane-proxy" }},
		{[]string{"dnsProxy=true"}, func(c agent.Config) bool { return c.DNSProxy != nil }},
		// (kvstore.tlsSecret's files are read at parse time: tools/chart tests its flags.)
		{[]string{"identityAllocationMode=kvstore", "kvstore.endpoints={http://10.0.0.10:2379,http://10.0.0.11:2379}"}, func(c agent.Config) bool {
			return c.Kvstore != nil && len(c.Kvstore.Endpoints) == 2 && c.Kvstore.NodeName == "node-1"
		}},
		{[]string{"identityAllocationMode=local"}, func(c agent.Config) bool { return c.K8s.Identity.Mode == k8s.IdentityLocal }},
		{[]string{"ipam.mode=static", "ipam.ipv4Range=10.1.0.0/24"}, func(c agent.Config) bool {
			return c.IPAM == agent.IPAMStatic && c.IPv4Range == netip.MustParsePrefix("10.1.0.0/24") && !c.IPv6Range.IsValid()
		}},
	} {
		t.Run(strings.Join(tc.sets, ","), func(t *testing.T) {
			objs := kubetest.MustRenderChart(t, "membrane-system", tc.sets...)
			var stream []byte
			for _, o := range objs {
				b, err := json.Marshal(o.Object)
				if err != nil {
					t.Fatal(err)
				}
				stream = append(append(stream, b...), '\n')
			}
			args := daemonSetArgs(t, stream)
			cfg, _, err := parseFlags(args, io.Discard)
			if err != nil {
				t.Fatalf("membrane-agent %v: %v", args, err)
			}
			if !tc.check(cfg) {
				t.Fatalf("membrane-agent %v: config %+v", args, cfg)
			}
		})
	}
}
