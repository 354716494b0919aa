package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
)

// testScenario is a scenario scaled down for go test -race: a couple of
// hundred endpoints, two seconds of churn, short timeouts.
func testScenario(name string) Scenario {
	sc := Defaults()
	sc.Name = name
	sc.Endpoints, sc.Duration, sc.Workers, sc.Identities = 200, Duration(2*time.Second), 8, 8
	sc.LabelChurn = 0.2
	sc.QuiesceTimeout = Duration(15 * time.Second)
	sc.APIRequestTimeout = Duration(3 * time.Second)
	return sc
}

func runScenario(tb testing.TB, sc Scenario) *Report {
	tb.Helper()
	r, err := Run(context.Background(), sc, Options{Dir: tb.TempDir()})
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

func requireClean(tb testing.TB, r *Report) {
	tb.Helper()
	if !r.OK() {
		var b strings.Builder
		r.WriteText(&b)
		tb.Fatalf("the run found violations:\n%s", b.String())
	}
}

// TestRunNoFaults: a clean run holds every invariant and reports what
// --report promises.
func TestRunNoFaults(t *testing.T) {
	sc := testScenario("no-faults")
	sc.PolicyChurn = 0.5
	r := runScenario(t, sc)
	requireClean(t, r)
	if r.Lifecycles == 0 || r.LiveEndpointsPeak == 0 || r.LiveEndpointsPeak > sc.Endpoints {
		t.Errorf("lifecycles %d, live peak %d (of %d)", r.Lifecycles, r.LiveEndpointsPeak, sc.Endpoints)
	}
	for _, op := range []string{"ipam_allocate", "endpoint_put", "endpoint_regenerate", "endpoint_delete"} {
		if s := r.LatencyMS[op]; s == nil || s.Count == 0 || s.P50 <= 0 || s.P99 < s.P50 {
			t.Errorf("latency of %s: %+v", op, s)
		}
	}
	if r.Regenerations.Run == 0 || r.Regenerations.Requested < r.Regenerations.Run {
		t.Errorf("regenerations %+v", r.Regenerations)
	}
	if r.PolicyChurn == "" {
		t.Error("policy churn was asked for and not reported")
	}
	checkReportFiles(t, r)
}

// checkReportFiles writes the JSON and HTML reports and checks the keys
// and the page.
func checkReportFiles(t *testing.T, r *Report) {
	t.Helper()
	dir := t.TempDir()
	jsonPath, htmlPath := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.html")
	if err := r.WriteJSONFile(jsonPath); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"lifecycles_per_second", "live_endpoints_peak", "heap_bytes_per_live_endpoint", "restarts", "regenerations"} {
		if _, ok := m[key]; !ok {
			t.Errorf("report has no %q", key)
		}
	}
	if v, ok := m["violations"].([]any); !ok || v == nil {
		t.Errorf("violations is %T, want a list", m["violations"])
	}
	lat, _ := m["latency_ms"].(map[string]any)
	put, _ := lat["endpoint_put"].(map[string]any)
	if _, ok := put["p50"]; !ok {
		t.Errorf("latency_ms.endpoint_put has no p50: %v", put)
	}
	if _, ok := put["p99"]; !ok {
		t.Errorf("latency_ms.endpoint_put has no p99: %v", put)
	}
	if err := r.WriteHTMLFile(htmlPath); err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(htmlPath)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Count(page, []byte("<svg")) < 4 || bytes.Contains(page, []byte("<script")) || bytes.Contains(page, []byte("src=")) {
		t.Errorf("HTML report is not a self-contained page with plots (%d bytes)", len(page))
	}
}

// TestRunFaults: every fault at 10%, no crash: still no violation.
func TestRunFaults(t *testing.T) {
	sc := testScenario("faults")
	sc.SetFaultRate(0.1)
	sc.Faults.SlowDatapathDelay = Duration(5 * time.Millisecond)
	sc.Faults.ClientTimeout = Duration(10 * time.Millisecond)
	sc.ProxyWaitTimeout = Duration(50 * time.Millisecond)
	r := runScenario(t, sc)
	requireClean(t, r)
	if r.Lifecycles == 0 {
		t.Error("no lifecycle completed")
	}
}

// TestRunCrashesAndFaults: crash/restarts with faults on; the restore
// contract holds.
func TestRunCrashesAndFaults(t *testing.T) {
	sc := testScenario("crashes")
	sc.SetFaultRate(0.05)
	sc.Faults.SlowDatapathDelay = Duration(5 * time.Millisecond)
	sc.ProxyWaitTimeout = Duration(50 * time.Millisecond)
	sc.Crashes, sc.Duration = 3, Duration(3*time.Second)
	r := runScenario(t, sc)
	requireClean(t, r)
	t.Logf("%d crash leftovers collected by the GC", r.CrashLeftoversCollected)
	if r.Restarts != sc.Crashes {
		t.Errorf("%d restarts, want %d", r.Restarts, sc.Crashes)
	}
}

// TestRunRefusesLargeLinux: more than maxLinuxEndpoints with the linux
// datapath needs ForceLinux (the refusal comes before anything is made).
func TestRunRefusesLargeLinux(t *testing.T) {
	sc := testScenario("linux")
	sc.Datapath, sc.Endpoints = "linux", maxLinuxEndpoints+1
	_, err := Run(context.Background(), sc, Options{Dir: t.TempDir()})
	if !errors.Is(err, ErrInvalidScenario) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("Run with %d linux endpoints: %v, want an invalid scenario naming --force", sc.Endpoints, err)
	}
}

// TestCrashLeavesSocket: agent.Crash leaves the socket file as a killed
// process does, and an agent starts again on it.
func TestCrashLeavesSocket(t *testing.T) {
	dir := t.TempDir()
	cfg := agent.Config{Socket: filepath.Join(dir, "a.sock"), StateDir: filepath.Join(dir, "state"),
		IPv4Range: netip.MustParsePrefix("10.202.0.0/24"), Datapath: "fake", Fake: datapath.NewFake(1)}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := agent.Start(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	a.Crash()
	if _, err := os.Stat(cfg.Socket); err != nil {
		t.Fatalf("socket after Crash: %v", err)
	}
	b, err := agent.Start(cfg, log)
	if err != nil {
		t.Fatalf("start after Crash: %v", err)
	}
	if err := b.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}
