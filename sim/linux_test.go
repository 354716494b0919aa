//go:build linux

package sim

import (
	"context"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// buildCNI builds membrane-cni into a temporary directory, as `make
// build` does (static).
func buildCNI(t *testing.T) string {
	t.Helper()
	return testutil.BuildBinariesT(t, "membrane-cni")
}

// simLeftovers lists what linux runs leave in the kernel if they do not
// clean up: network namespaces and bpffs mounts of the harness.
func simLeftovers(t *testing.T) []string {
	t.Helper()
	var out []string
	entries, _ := os.ReadDir("/var/run/netns")
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "msim-") {
			out = append(out, "netns "+e.Name())
		}
	}
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		if strings.Contains(line, "membrane-sim-bpffs-") {
			out = append(out, "mount "+line)
		}
	}
	return out
}

// TestRunLinux: a scaled-down linux run (real plugin, netns per pod, BPF)
// with policy churn and one crash/restart holds every
// invariant, the kernel checks included, and leaves nothing behind.
func TestRunLinux(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildCNI(t)
	before := len(simLeftovers(t)) // other packages' runs may be under way
	sc := testScenario("linux")
	sc.Datapath = "linux"
	sc.Endpoints, sc.Workers, sc.Identities, sc.Duration, sc.Crashes = 20, 4, 4, Duration(5*time.Second), 1
	sc.PolicyChurn = 0.3
	// No relabels: they are covered on the fake datapath
	// (TestRunCrashesAndFaults); this test keeps to the kernel path.
	sc.LabelChurn = 0
	sc.APIRequestTimeout = Duration(5 * time.Second)
	r, err := Run(context.Background(), sc, Options{Dir: t.TempDir(), CNIBinDir: bin})
	if err != nil {
		t.Fatal(err)
	}
	requireClean(t, r)
	if r.Restarts != 1 {
		t.Errorf("%d restarts, want 1", r.Restarts)
	}
	for _, op := range []string{"cni_add", "cni_del", "endpoint_regenerate"} {
		if s := r.LatencyMS[op]; s == nil || s.Count == 0 {
			t.Errorf("no successful %s: %+v", op, s)
		}
	}
	if r.Lifecycles == 0 {
		t.Error("no lifecycle completed")
	}
	if left := simLeftovers(t); len(left) > before {
		t.Errorf("left behind: %v", left)
	}
}

// TestDualStackResult: the CNI driver takes a result only with one
// address of each family on the pod's interface.
func TestDualStackResult(t *testing.T) {
	ipc := func(cidr string, iface int) *types100.IPConfig {
		_, n, _ := net.ParseCIDR(cidr)
		ip, _, _ := net.ParseCIDR(cidr)
		n.IP = ip
		return &types100.IPConfig{Address: *n, Interface: types100.Int(iface)}
	}
	tests := []struct {
		name string
		ips  []*types100.IPConfig
		ok   bool
	}{
		{"both", []*types100.IPConfig{ipc("10.0.0.2/32", 1), ipc("fd00::2/128", 1)}, true},
		{"ipv4 only", []*types100.IPConfig{ipc("10.0.0.2/32", 1)}, false},
		{"ipv6 only", []*types100.IPConfig{ipc("fd00::2/128", 1)}, false},
		{"two ipv4", []*types100.IPConfig{ipc("10.0.0.2/32", 1), ipc("10.0.0.3/32", 1)}, false},
		{"host interface", []*types100.IPConfig{ipc("10.0.0.2/32", 1), ipc("fd00::2/128", 0)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v4, err := dualStackResult(&types100.Result{IPs: tt.ips})
			if (err == nil) != tt.ok || (tt.ok && v4 != netip.MustParseAddr("10.0.0.2")) {
				t.Fatalf("dualStackResult = %s, %v; want ok %v", v4, err, tt.ok)
			}
		})
	}
	if got := linuxIPv6Range(netip.MustParsePrefix("10.200.0.0/16")); got != netip.MustParsePrefix("fd00:5153::/112") {
		t.Fatalf("linuxIPv6Range(/16) = %s", got)
	}
}

// TestRunLinuxProxyFaults: the proxy faults (slow and lost
// acknowledgements) against the real membrane-proxy on the Linux
// datapath: the policy churn writes HTTP rules, regenerations wait for
// the proxy's acknowledgements, some of which are lost (then the wait
// times out, or a later version's acknowledgement covers it); every
// invariant holds and nothing is left behind.
func TestRunLinuxProxyFaults(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.BuildBinariesT(t, "membrane-cni", "membrane-proxy")
	before := len(simLeftovers(t))
	sc := testScenario("linux-proxy-faults")
	sc.Datapath = "linux"
	sc.Endpoints, sc.Workers, sc.Identities, sc.Duration = 20, 4, 4, Duration(5*time.Second)
	sc.PolicyChurn, sc.LabelChurn = 0.5, 0
	sc.APIRequestTimeout = Duration(5 * time.Second)
	sc.Faults.ProxyAcks, sc.Faults.ProxyAckDelay, sc.Faults.ProxyAckDropRate = 1, Duration(5*time.Millisecond), 0.5
	r, err := Run(context.Background(), sc, Options{Dir: t.TempDir(), CNIBinDir: bin})
	if err != nil {
		t.Fatal(err)
	}
	requireClean(t, r)
	var b strings.Builder
	r.WriteText(&b)
	t.Log(b.String())
	// Regenerations wait only for a real proxy here (no fake hooks): a
	// timeout proves they did and that lost acknowledgements end in one.
	// Half the acknowledgements are lost: a run without any timeout would
	// mean the proxy or the HTTP rules are not in play.
	if r.ProxyTimeouts == 0 {
		t.Errorf("no proxy wait timed out with half the acknowledgements lost")
	}
	if left := simLeftovers(t); len(left) > before {
		t.Errorf("left behind: %v", left)
	}
}
