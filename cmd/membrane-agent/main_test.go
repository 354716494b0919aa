package main

import (
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/pkg/agent"
)

func TestFlags(t *testing.T) {
	base := []string{"--socket", "/tmp/x.sock", "--state-dir", "/tmp/x", "--datapath", "fake"}
	tests := []struct {
		name    string
		args    []string
		wantErr string
		check   func(t *testing.T, addr string, pprof bool)
	}{
		{name: "defaults: loopback listener, no pprof", check: func(t *testing.T, addr string, pprof bool) {
			if addr != "127.0.0.1:9890" || pprof {
				t.Errorf("http-addr %q pprof %v", addr, pprof)
			}
		}},
		{name: "disabled", args: []string{"--http-addr", ""}, check: func(t *testing.T, addr string, _ bool) {
			if addr != "" {
				t.Errorf("http-addr %q", addr)
			}
		}},
		{name: "explicit with pprof", args: []string{"--http-addr", "0.0.0.0:9999", "--pprof"}, check: func(t *testing.T, addr string, pprof bool) {
			if addr != "0.0.0.0:9999" || !pprof {
				t.Errorf("http-addr %q pprof %v", addr, pprof)
			}
		}},
		{name: "bad address", args: []string{"--http-addr", "9890"}, wantErr: "--http-addr"},
		{name: "allowed host with port", args: []string{"--http-allowed-hosts", "node1:9890"}, wantErr: "--http-allowed-hosts"},
		{name: "empty allowed host", args: []string{"--http-allowed-hosts", "a,,b"}, wantErr: "--http-allowed-hosts"},
		{name: "negative cap", args: []string{"--http-max-connections", "-1"}, wantErr: "--http-max-connections"},
		{name: "negative socket cap", args: []string{"--max-connections", "-1"}, wantErr: "--max-connections"},
		{name: "allowed hosts and caps", args: []string{"--http-allowed-hosts", "node1.example,10.0.0.5,fd00::5", "--http-max-connections", "8"},
			check: func(t *testing.T, _ string, _ bool) {}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := parseFlags(append(append([]string{}, base...), tc.args...), io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, cfg.HTTPAddr, cfg.API.Pprof)
		})
	}
}

func TestParseFlagsIPAMExpiry(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    time.Duration // the IPAM config's Expiry
		wantErr string
	}{
		{nil, 10 * time.Minute, ""},
		{[]string{"--ipam-expiry", "90s"}, 90 * time.Second, ""},
		{[]string{"--ipam-expiry", "0"}, -1, ""},
		{[]string{"--ipam-expiry", "500ms"}, 0, "--ipam-expiry"},
		{[]string{"--ipam-expiry", "-1m"}, 0, "--ipam-expiry"},
		{[]string{"--ipam-expiry", "soon"}, 0, "ipam-expiry"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			args := append([]string{"--datapath", "fake", "--socket", "/tmp/x.sock", "--state-dir", "/tmp/x"}, tc.args...)
			cfg, _, err := parseFlags(args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Actors.IPAM.Expiry != tc.want {
				t.Errorf("expiry %v, want %v", cfg.Actors.IPAM.Expiry, tc.want)
			}
		})
	}
}

// TestParseFlagsRanges: IPv4 by default, dual-stack with --ipv6-range,
// IPv6-only with --ipv4-range ""; no range at all, a range of the wrong
// family or a bad CIDR is refused naming the flag.
func TestParseFlagsRanges(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		v4, v6  string // wanted ranges ("" none)
		wantErr string
	}{
		{"default ipv4", nil, "10.200.0.0/16", "", ""},
		{"dual-stack", []string{"--ipv6-range", "fd00:200::/112"}, "10.200.0.0/16", "fd00:200::/112", ""},
		{"ipv6-only", []string{"--ipv4-range", "", "--ipv6-range", "fd00:200::/112"}, "", "fd00:200::/112", ""},
		{"no range", []string{"--ipv4-range", ""}, "", "", "--ipv6-range"},
		{"ipv6 as ipv4", []string{"--ipv4-range", "fd00::/112"}, "", "", "--ipv4-range"},
		{"ipv4 as ipv6", []string{"--ipv6-range", "10.1.0.0/24"}, "", "", "--ipv6-range"},
		{"blank", []string{"--ipv4-range", " "}, "", "", "--ipv4-range"},
		{"host bits", []string{"--ipv6-range", "fd00::1/112"}, "", "", "--ipv6-range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--datapath", "fake", "--socket", "/tmp/x.sock", "--state-dir", "/tmp/x"}, tc.args...)
			cfg, _, err := parseFlags(args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			str := func(p netip.Prefix) string {
				if !p.IsValid() {
					return ""
				}
				return p.String()
			}
			if str(cfg.IPv4Range) != tc.v4 || str(cfg.IPv6Range) != tc.v6 {
				t.Fatalf("ranges %v %v, want %q %q", cfg.IPv4Range, cfg.IPv6Range, tc.v4, tc.v6)
			}
		})
	}
}

func TestParseFlagsK8s(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	host = strings.ToLower(host) // as kubelet names the node
	for _, tc := range []struct {
		name      string
		args      []string
		node      string // "" : standalone (cfg.K8s nil)
		incluster bool
		wantErr   string
	}{
		{"standalone", nil, "", false, ""},
		{"kubeconfig", []string{"--k8s-kubeconfig", kc, "--node-name", "node-1"}, "node-1", false, ""},
		{"hostname", []string{"--k8s-kubeconfig", kc}, host, false, ""},
		{"in cluster", []string{"--k8s", "--node-name", "n"}, "n", true, ""},
		{"missing kubeconfig", []string{"--k8s-kubeconfig", kc + ".missing", "--node-name", "n"}, "", false, "--k8s-kubeconfig"},
		{"bad node name", []string{"--k8s-kubeconfig", kc, "--node-name", "Node_1"}, "", false, "--node-name"},
		{"node name alone", []string{"--node-name", "n"}, "", false, "--node-name"},
		{"ipam kubernetes", []string{"--k8s-kubeconfig", kc, "--node-name", "n", "--ipam", "kubernetes", "--k8s-pod-cidr-wait", "30s"}, "n", false, ""},
		{"ipam kubernetes standalone", []string{"--ipam", "kubernetes"}, "", false, "--ipam"},
		{"ipam unknown", []string{"--ipam", "dhcp"}, "", false, "--ipam"},
		{"api server", []string{"--k8s", "--node-name", "n", "--k8s-api-server", "https://10.0.0.1:6443"}, "n", true, ""},
		{"api server name", []string{"--k8s", "--node-name", "n", "--k8s-api-server", "https://api.example:443/"}, "n", true, ""},
		{"api server with kubeconfig", []string{"--k8s-kubeconfig", kc, "--node-name", "n", "--k8s-api-server", "https://[fd00::1]:6443"}, "n", false, ""},
		{"api server http", []string{"--k8s", "--node-name", "n", "--k8s-api-server", "http://10.0.0.1:6443"}, "", false, "--k8s-api-server"},
		{"api server path", []string{"--k8s", "--node-name", "n", "--k8s-api-server", "https://10.0.0.1:6443/api"}, "", false, "--k8s-api-server"},
		{"api server no port", []string{"--k8s", "--node-name", "n", "--k8s-api-server", "https://10.0.0.1"}, "", false, "--k8s-api-server"},
		{"api server bad port", []string{"--k8s", "--node-name", "n", "--k8s-api-server", "https://10.0.0.1:70000"}, "", false, "--k8s-api-server"},
		{"api server user", []string{"--k8s", "--node-name", "n", "--k8s-api-server", "https://u:p@10.0.0.1:6443"}, "", false, "--k8s-api-server"},
		{"api server standalone", []string{"--k8s-api-server", "https://10.0.0.1:6443"}, "", false, "--k8s-api-server"},
		{"negative pod cidr wait", []string{"--k8s-kubeconfig", kc, "--node-name", "n", "--k8s-pod-cidr-wait", "-1s"}, "", false, "PodCIDRWait"},
		{"node labels", []string{"--k8s", "--node-name", "n", "--enable-node-selector-labels", "--node-labels", `topology\.kubernetes\.io !kubernetes\.io/hostname`}, "n", true, ""},
		{"node labels without node selector labels", []string{"--k8s", "--node-name", "n", "--node-labels", "topology"}, "", false, "--node-labels"},
		{"node labels bad pattern", []string{"--k8s", "--node-name", "n", "--enable-node-selector-labels", "--node-labels", "a("}, "", false, "--node-labels"},
		{"client qps negative", []string{"--k8s", "--node-name", "n", "--k8s-client-qps", "-1"}, "", false, "--k8s-client-qps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--datapath", "fake", "--socket", "/tmp/x.sock", "--state-dir", "/tmp/x"}, tc.args...)
			cfg, _, err := parseFlags(args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.node == "" && cfg.K8s != nil:
				t.Fatalf("K8s = %+v, want standalone", cfg.K8s)
			case tc.node != "" && (cfg.K8s == nil || cfg.K8s.NodeName != tc.node || cfg.K8s.InCluster != tc.incluster):
				t.Fatalf("K8s = %+v, want node %q in-cluster %v", cfg.K8s, tc.node, tc.incluster)
			}
		})
	}
}

func TestParseFlagsIdentityMode(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--datapath", "fake", "--socket", "/tmp/x.sock", "--state-dir", "/tmp/x", "--k8s-kubeconfig", kc, "--node-name", "n1"}
	for _, tc := range []struct {
		name    string
		args    []string
		crd     bool
		wantErr string
	}{
		{"default crd", nil, true, ""},
		{"local", []string{"--identity-allocation-mode", "local"}, false, ""},
		{"crd with gc flags", []string{"--identity-allocation-mode", "crd", "--identity-gc-grace", "1m", "--identity-gc-interval", "-1s"}, true, ""},
		{"bad mode", []string{"--identity-allocation-mode", "etcd"}, false, "--identity-allocation-mode"},
		{"negative grace", []string{"--identity-gc-grace", "-1m"}, false, "--identity-gc-grace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := parseFlags(append(append([]string{}, base...), tc.args...), io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.K8s == nil || cfg.K8s.CRDIdentities() != tc.crd {
				t.Fatalf("K8s = %+v, want crd identities %v", cfg.K8s, tc.crd)
			}
		})
	}
}

func TestParseFlagsKvstore(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "missing-ca.pem")
	for _, tc := range []struct {
		name    string
		args    []string
		want    []string // etcd endpoints; nil: kvstore off
		wantErr string
	}{
		{"off", nil, nil, ""},
		{"etcd", []string{"--kvstore", "etcd", "--etcd-endpoints", "http://10.0.0.1:2379,https://10.0.0.2:2379", "--node-name", "n1",
			"--kvstore-node-addrs", "192.168.1.1,fd00::1"}, []string{"http://10.0.0.1:2379", "https://10.0.0.2:2379"}, ""},
		{"no endpoints", []string{"--kvstore", "etcd", "--node-name", "n1"}, nil, "--etcd-endpoints"},
		{"bad endpoint", []string{"--kvstore", "etcd", "--etcd-endpoints", "10.0.0.1:2379", "--node-name", "n1"}, nil, "--etcd-endpoints"},
		{"unknown kvstore", []string{"--kvstore", "consul"}, nil, "--kvstore"},
		{"etcd flags without kvstore", []string{"--etcd-endpoints", "http://a:1"}, nil, "--kvstore etcd"},
		{"cert without key", []string{"--kvstore", "etcd", "--etcd-endpoints", "https://a:1", "--node-name", "n1", "--etcd-cert", "c.pem"}, nil, "--etcd-cert"},
		{"missing CA file", []string{"--kvstore", "etcd", "--etcd-endpoints", "https://a:1", "--node-name", "n1", "--etcd-ca", ca}, nil, "--etcd-ca"},
		{"bad node addr", []string{"--kvstore", "etcd", "--etcd-endpoints", "http://a:1", "--node-name", "n1", "--kvstore-node-addrs", "x"}, nil, "--kvstore-node-addrs"},
		{"short lease", []string{"--kvstore", "etcd", "--etcd-endpoints", "http://a:1", "--node-name", "n1", "--kvstore-lease-ttl", "1s"}, nil, "--kvstore-lease-ttl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--datapath", "fake", "--socket", "/tmp/x.sock", "--state-dir", "/tmp/x"}, tc.args...)
			cfg, _, err := parseFlags(args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				if cfg.Kvstore != nil {
					t.Fatalf("Kvstore = %+v, want off", cfg.Kvstore)
				}
				return
			}
			if cfg.Kvstore == nil || !slices.Equal(cfg.Kvstore.Endpoints, tc.want) || cfg.Kvstore.NodeName != "n1" || len(cfg.NodeAddrs) != 2 {
				t.Fatalf("Kvstore = %+v, NodeAddrs %v", cfg.Kvstore, cfg.NodeAddrs)
			}
		})
	}
}

// TestParseFlagsKubeProxyReplacement: the mode reaches the datapath's
// config with its cgroup and devices; those need the mode, which needs
// Kubernetes mode.
func TestParseFlagsKubeProxyReplacement(t *testing.T) {
	base := []string{"--socket", "/tmp/x.sock", "--state-dir", "/tmp/x"}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k8s := []string{"--k8s-kubeconfig", kubeconfig, "--node-name", "n1"}
	cfg, _, err := parseFlags(slices.Concat(base, k8s, []string{"--kube-proxy-replacement", "--socket-lb-cgroup", "/sys/fs/cgroup/x", "--devices", "eth0,eth1"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.Linux.Services
	if !s.KubeProxyReplacement || s.Cgroup != "/sys/fs/cgroup/x" || !slices.Equal(s.Devices, []string{"eth0", "eth1"}) || !cfg.K8s.KubeProxyReplacement {
		t.Fatalf("services config %+v", s)
	}
	if cfg, _, err = parseFlags(slices.Concat(base, k8s), io.Discard); err != nil || cfg.Linux.Services.KubeProxyReplacement {
		t.Fatalf("default: %+v, %v: want the mode off", cfg.Linux.Services, err)
	}
	if _, _, err = parseFlags(slices.Concat(base, k8s, []string{"--devices", "eth0"}), io.Discard); err == nil || !strings.Contains(err.Error(), "--devices") {
		t.Fatalf("--devices without the mode: %v, want refused", err)
	}
	// Native routing's direct delivery runs on the devices too.
	if cfg, _, err = parseFlags(slices.Concat(base, []string{"--routing", "native", "--devices", "eth1"}), io.Discard); err != nil ||
		!slices.Equal(cfg.Linux.Services.Devices, []string{"eth1"}) {
		t.Fatalf("--routing native --devices eth1: %+v, %v: want the device", cfg.Linux.Services, err)
	}
}

func TestParseFlagsBPFAttach(t *testing.T) {
	base := []string{"--datapath", "fake", "--socket", "/tmp/x.sock", "--state-dir", "/tmp/x"}
	for _, tc := range []struct {
		name    string
		args    []string
		legacy  bool
		epTCX   bool
		wantErr string
	}{
		{"default auto", nil, false, false, ""},
		{"auto", []string{"--bpf-attach", "auto"}, false, false, ""},
		{"tcx", []string{"--bpf-attach", "tcx"}, false, true, ""},
		{"tc", []string{"--bpf-attach", "tc"}, true, false, ""},
		{"bad", []string{"--bpf-attach", "xdp"}, false, false, "--bpf-attach"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := parseFlags(append(append([]string{}, base...), tc.args...), io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Linux.ForceLegacyTC != tc.legacy || cfg.Linux.EndpointTCX != tc.epTCX {
				t.Fatalf("ForceLegacyTC = %v, EndpointTCX = %v; want %v, %v", cfg.Linux.ForceLegacyTC, cfg.Linux.EndpointTCX, tc.legacy, tc.epTCX)
			}
		})
	}
}

func TestParseFlagsGCPercent(t *testing.T) {
	base := []string{"--datapath", "fake", "--socket", "/tmp/x.sock", "--state-dir", "/tmp/x"}
	cfg, _, err := parseFlags(base, io.Discard)
	if err != nil || cfg.GCPercent != agent.DefaultGCPercent {
		t.Fatalf("default: GCPercent %d, err %v; want %d", cfg.GCPercent, err, agent.DefaultGCPercent)
	}
	cfg, _, err = parseFlags(append(append([]string{}, base...), "--gc-percent", "100"), io.Discard)
	if err != nil || cfg.GCPercent != 100 {
		t.Fatalf("--gc-percent 100: GCPercent %d, err %v", cfg.GCPercent, err)
	}
	for _, bad := range []string{"10", "5000", "-1"} {
		cfg, _, err = parseFlags(append(append([]string{}, base...), "--gc-percent", bad), io.Discard)
		if err == nil {
			err = cfg.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), "--gc-percent") {
			t.Fatalf("--gc-percent %s: err %v, want one naming the flag", bad, err)
		}
	}
}

func TestParseFlagsMemoryLimit(t *testing.T) {
	base := []string{"--datapath", "fake", "--socket", "/tmp/x.sock", "--state-dir", "/tmp/x"}
	cfg, _, err := parseFlags(base, io.Discard)
	if err != nil || cfg.MemoryLimit != agent.DefaultMemoryLimitMiB<<20 {
		t.Fatalf("default: MemoryLimit %d, err %v; want %d MiB", cfg.MemoryLimit, err, agent.DefaultMemoryLimitMiB)
	}
	for arg, want := range map[string]int64{"0": 0, "64": 64 << 20} {
		cfg, _, err = parseFlags(append(append([]string{}, base...), "--memory-limit-mib", arg), io.Discard)
		if err != nil || cfg.MemoryLimit != want {
			t.Fatalf("--memory-limit-mib %s: MemoryLimit %d, err %v; want %d", arg, cfg.MemoryLimit, err, want)
		}
	}
	for _, bad := range []string{"-1", "99999999999", "1GiB"} {
		if _, _, err = parseFlags(append(append([]string{}, base...), "--memory-limit-mib", bad), io.Discard); err == nil || !strings.Contains(err.Error(), "memory-limit-mib") {
			t.Fatalf("--memory-limit-mib %s: err %v, want one naming the flag", bad, err)
		}
	}
}

func TestParseFlagsDatapathWorkers(t *testing.T) {
	base := []string{"--datapath", "fake", "--socket", "/tmp/x.sock", "--state-dir", "/tmp/x"}
	for _, tc := range []struct {
		args    []string
		want    int
		wantErr bool
	}{
		{nil, actors.DefaultPoolWorkers, false},
		{[]string{"--datapath-workers", "4"}, 4, false},
		{[]string{"--datapath-workers", "1024"}, 1024, false},
		{[]string{"--datapath-workers", "0"}, 0, true},
		{[]string{"--datapath-workers", "1025"}, 0, true},
	} {
		cfg, _, err := parseFlags(append(append([]string{}, base...), tc.args...), io.Discard)
		switch {
		case tc.wantErr && (err == nil || !strings.Contains(err.Error(), "--datapath-workers")):
			t.Errorf("%v: err %v, want one naming --datapath-workers", tc.args, err)
		case !tc.wantErr && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case !tc.wantErr && cfg.Actors.Pool.Workers != tc.want:
			t.Errorf("%v: workers %d, want %d", tc.args, cfg.Actors.Pool.Workers, tc.want)
		}
	}
}

// TestParseFlagsFlows: flow reports on by default, --flows=false turns
// them off; the flow log's sizes are checked.
func TestParseFlagsFlows(t *testing.T) {
	base := []string{"--datapath", "fake", "--socket", "/tmp/x.sock", "--state-dir", "/tmp/x"}
	cfg, _, err := parseFlags(base, io.Discard)
	if err != nil || !cfg.Linux.Flows || cfg.Flows.Capacity != 4096 || cfg.Flows.Rate != 5000 {
		t.Fatalf("default: Flows %v, %+v, err %v; want on, 4096, 5000/s", cfg.Linux.Flows, cfg.Flows, err)
	}
	cfg, _, err = parseFlags(append(append([]string{}, base...), "--flows=false", "--flows-buffer", "100", "--flows-rate", "10"), io.Discard)
	if err != nil || cfg.Linux.Flows || cfg.Flows.Capacity != 100 || cfg.Flows.Rate != 10 {
		t.Fatalf("--flows=false: Flows %v, %+v, err %v", cfg.Linux.Flows, cfg.Flows, err)
	}
	for _, bad := range [][]string{{"--flows-buffer", "0"}, {"--flows-buffer", "2000000"}, {"--flows-rate", "0"}} {
		_, _, err := parseFlags(append(append([]string{}, base...), bad...), io.Discard)
		if err == nil || !strings.Contains(err.Error(), bad[0]) {
			t.Errorf("%v: err %v, want one naming the flag", bad, err)
		}
	}
}

// TestParseFlagsPolicySecrets: --policy-secrets-namespace defaults to
// membrane-secrets in Kubernetes mode, takes a namespace name or ""
// (every secret refused), and outside Kubernetes mode the agent reads no
// Secrets: the namespace stays "" and giving one is refused.
func TestParseFlagsPolicySecrets(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		want    string
		wantErr string
	}{
		{"default", []string{"--k8s", "--node-name", "n"}, "membrane-secrets", ""},
		{"named", []string{"--k8s", "--node-name", "n", "--policy-secrets-namespace", "cilium-secrets"}, "cilium-secrets", ""},
		{"none", []string{"--k8s", "--node-name", "n", "--policy-secrets-namespace", ""}, "", ""},
		{"bad name", []string{"--k8s", "--node-name", "n", "--policy-secrets-namespace", "Secrets"}, "", "--policy-secrets-namespace"},
		{"standalone", nil, "", ""},
		{"standalone given", []string{"--policy-secrets-namespace", "membrane-secrets"}, "", "only with --k8s-kubeconfig or --k8s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--datapath", "fake", "--socket", "/tmp/x.sock", "--state-dir", "/tmp/x"}, tc.args...)
			cfg, _, err := parseFlags(args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Actors.PolicySecretsNamespace != tc.want {
				t.Errorf("PolicySecretsNamespace %q, want %q", cfg.Actors.PolicySecretsNamespace, tc.want)
			}
		})
	}
}

func TestParseFlagsNodePortRange(t *testing.T) {
	base := []string{"--datapath", "fake"}
	cfg, _, err := parseFlags(base, io.Discard)
	if err != nil || cfg.Linux.Services.NodePortRange != [2]uint16{30000, 32767} || !cfg.Linux.Services.ProtectNodePortRange {
		t.Fatalf("default: range %v protect %v, err %v", cfg.Linux.Services.NodePortRange, cfg.Linux.Services.ProtectNodePortRange, err)
	}
	for in, want := range map[string][2]uint16{"20000-22767": {20000, 22767}, "30000,32767": {30000, 32767}, "80-80": {80, 80}} {
		cfg, _, err := parseFlags(append(append([]string{}, base...), "--node-port-range", in), io.Discard)
		if err != nil || cfg.Linux.Services.NodePortRange != want {
			t.Errorf("%q: %v, err %v; want %v", in, cfg.Linux.Services.NodePortRange, err, want)
		}
	}
	for _, bad := range []string{"", "30000", "0-10", "3-2", "1-65536", "a-b"} {
		if _, _, err := parseFlags(append(append([]string{}, base...), "--node-port-range", bad), io.Discard); err == nil || !strings.Contains(err.Error(), "--node-port-range") {
			t.Errorf("%q: err %v, want one naming the flag", bad, err)
		}
	}
}
