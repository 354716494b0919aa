package agent_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

type restoreEnv struct {
	cfg agent.Config
	log *slog.Logger
}

func newRestoreEnv(tb testing.TB) *restoreEnv {
	tb.Helper()
	dir := tb.TempDir()
	return &restoreEnv{
		cfg: agent.Config{
			Socket: filepath.Join(dir, "m.sock"), StateDir: filepath.Join(dir, "state"),
			IPv4Range: netip.MustParsePrefix("10.233.0.0/24"), IPv6Range: netip.MustParsePrefix("fd00:233::/120"),
			Datapath: "fake",
		},
		log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

func (e *restoreEnv) start(tb testing.TB, fake *datapath.Fake) (*agent.Agent, *client.Client) {
	tb.Helper()
	cfg := e.cfg
	cfg.Fake = fake
	a, err := agent.Start(cfg, e.log)
	if err != nil {
		tb.Fatal(err)
	}
	c := client.New(cfg.Socket)
	tb.Cleanup(func() { c.Close(); _ = a.Stop(context.Background()) })
	return a, c
}

func stop(tb testing.TB, a *agent.Agent) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Stop(ctx); err != nil {
		tb.Fatal(err)
	}
}

func addPod(tb testing.TB, c *client.Client, name, app string, sync bool) *models.Endpoint {
	tb.Helper()
	ctx := context.Background()
	ipr, err := c.IPAMAllocate(ctx, "", "default/"+name)
	if err != nil {
		tb.Fatal(err)
	}
	ep, err := c.EndpointCreate(ctx, "container-id:"+name, &models.EndpointChangeRequest{
		K8sNamespace: "default", K8sPodName: name, Labels: []string{"k8s:app=" + app},
		Addressing: ipr.Address, SyncBuild: sync,
	})
	if err != nil {
		tb.Fatal(err)
	}
	return ep
}

func waitReady(tb testing.TB, c *client.Client, ref string) *models.Endpoint {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ep, err := c.EndpointGet(context.Background(), ref)
		if err == nil && ep.State == "ready" {
			return ep
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s not ready: %+v %v", ref, ep, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRestoreAfterRestart: endpoints, their IPs and identity numbers come
// back after a restart on the same state dir; a deletion stays done; new
// allocations do not collide with restored addresses.
func TestRestoreAfterRestart(t *testing.T) {
	env := newRestoreEnv(t)
	a, c := env.start(t, nil)
	var before []*models.Endpoint
	for i := 0; i < 6; i++ {
		before = append(before, addPod(t, c, fmt.Sprintf("p%d", i), []string{"web", "db"}[i%2], i%3 != 0))
	}
	if err := c.EndpointDelete(context.Background(), "container-id:p5"); err != nil {
		t.Fatal(err)
	}
	for i := range before[:5] {
		before[i] = waitReady(t, c, fmt.Sprintf("container-id:p%d", i))
	}
	stop(t, a)

	a2, c2 := env.start(t, nil)
	if st := a2.RestoreStats(); st.Restored != 5 || st.Invalid != 0 || st.Quarantined != 0 {
		t.Fatalf("restore stats %+v, want 5 restored", st)
	}
	for i, want := range before[:5] {
		got := waitReady(t, c2, fmt.Sprintf("container-id:p%d", i))
		if got.ID != want.ID || got.Addressing.IPv4 != want.Addressing.IPv4 || got.Addressing.IPv6 != want.Addressing.IPv6 ||
			got.Identity.ID != want.Identity.ID {
			t.Errorf("p%d: restored %+v, want %+v", i, got, want)
		}
	}
	if _, err := c2.EndpointGet(context.Background(), "container-id:p5"); !client.IsNotFound(err) {
		t.Fatalf("deleted endpoint came back: %v", err)
	}
	st, err := c2.IPAMStatus(context.Background())
	if err != nil || st.IPv4.Used != 5 || st.IPv6.Used != 5 {
		t.Fatalf("IPAM after restore: %+v %v, want 5 used per family", st, err)
	}
	fresh := addPod(t, c2, "new", "web", true)
	for _, ep := range before[:5] {
		if fresh.Addressing.IPv4 == ep.Addressing.IPv4 {
			t.Fatalf("new pod got restored address %s", ep.Addressing.IPv4)
		}
	}
	ids, _ := c2.Identities(context.Background())
	for _, id := range ids {
		if id.Labels[0] == "k8s:app=web" && id.RefCount != 4 {
			t.Errorf("identity %d refcount %d, want 4 (p0, p2, p4, new)", id.ID, id.RefCount)
		}
	}
}

// TestRestoreHandlesDamagedState: a corrupt file, an unknown version and
// a truncated file are quarantined with a log line, an interrupted write
// (<id>_next, <id>_stale) resolves to a readable state, and an endpoint
// whose interface vanished is deleted without releasing its IP.
func TestRestoreHandlesDamagedState(t *testing.T) {
	env := newRestoreEnv(t)
	fake := datapath.NewFake(3)
	a, c := env.start(t, fake)
	eps := map[string]*models.Endpoint{}
	for _, n := range []string{"ok", "corrupt", "future", "trunc", "stale", "gone"} {
		eps[n] = addPod(t, c, n, n, true)
	}
	stop(t, a)

	dir := env.cfg.StateDir
	path := func(n, file string) string { return filepath.Join(dir, fmt.Sprint(eps[n].ID), file) }
	write := func(p, data string) {
		if err := os.WriteFile(p, []byte(data), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	write(path("corrupt", "ep.json"), "{not json")
	write(path("future", "ep.json"), `{"version": 99, "endpoint": {}}`)
	data, _ := os.ReadFile(path("trunc", "ep.json"))
	write(path("trunc", "ep.json"), string(data[:len(data)/2]))
	// Interrupted between the renames: only <id>_stale is left.
	staleDir := filepath.Join(dir, fmt.Sprint(eps["stale"].ID))
	if err := os.Rename(staleDir, staleDir+"_stale"); err != nil {
		t.Fatal(err)
	}
	// An interrupted write of ok's next state.
	if err := os.MkdirAll(filepath.Join(dir, fmt.Sprint(eps["ok"].ID)+"_next"), 0o750); err != nil {
		t.Fatal(err)
	}
	fake.Forget(1000) // unrelated
	fake.Forget(uint16ID(eps["gone"].ID))

	a2, c2 := env.start(t, fake)
	st := a2.RestoreStats()
	if st.Restored != 2 || st.Quarantined != 3 || st.Invalid != 1 {
		t.Fatalf("restore stats %+v, want 2 restored, 3 quarantined, 1 invalid", st)
	}
	for _, n := range []string{"ok", "stale"} {
		waitReady(t, c2, "container-id:"+n)
	}
	q, _ := os.ReadDir(filepath.Join(dir, "quarantine"))
	if len(q) != 3 {
		t.Fatalf("quarantine holds %d entries, want 3", len(q))
	}
	// The interrupted write's <id>_next is scratch space for the next
	// write; the state itself is intact.
	if _, err := os.ReadFile(path("ok", "ep.json")); err != nil {
		t.Fatalf("state of ok after restore: %v", err)
	}
	// gone's IP was never re-reserved: the pool does not count it.
	ipam, _ := c2.IPAMStatus(context.Background())
	for _, al := range ipam.IPv4.Allocations {
		if al.IP == eps["gone"].Addressing.IPv4 {
			t.Fatalf("IP of an invalid endpoint is allocated: %+v", al)
		}
	}
}

func uint16ID(id int64) endpoint.ID { return endpoint.ID(id) }

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestRestoreDamagedStateMore extends TestRestoreHandlesDamagedState
// with what a crash or a full disk leaves: a zero-length ep.json (written
// but never flushed), a directory without ep.json, and a quarantine that cannot be made
// (a file named quarantine): the agent starts, logs one clear line per
// unreadable directory naming it and the cause, removes what it cannot
// quarantine, and the addresses of those endpoints are free.
func TestRestoreDamagedStateMore(t *testing.T) {
	env := newRestoreEnv(t)
	a, c := env.start(t, nil)
	eps := map[string]*models.Endpoint{}
	for _, n := range []string{"ok", "empty", "nofile"} {
		eps[n] = addPod(t, c, n, n, true)
	}
	stop(t, a)
	dir := env.cfg.StateDir
	epDir := func(n string) string { return filepath.Join(dir, fmt.Sprint(eps[n].ID)) }
	if err := os.Truncate(filepath.Join(epDir("empty"), "ep.json"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(epDir("nofile"), "ep.json")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "quarantine"), nil, 0o640); err != nil {
		t.Fatal(err)
	}

	logs := &syncBuffer{}
	env.log = slog.New(slog.NewTextHandler(logs, nil))
	a2, c2 := env.start(t, nil)
	if st := a2.RestoreStats(); st.Restored != 1 || st.Quarantined != 2 {
		t.Fatalf("restore stats %+v, want 1 restored, 2 unreadable", st)
	}
	waitReady(t, c2, "container-id:ok")
	for _, n := range []string{"empty", "nofile"} {
		line := fmt.Sprintf(`msg="unreadable endpoint state set aside" dir=%s`, epDir(n))
		if !strings.Contains(logs.String(), line) {
			t.Errorf("no log line %q in:\n%s", line, logs.String())
		}
		if _, err := os.Stat(epDir(n)); !os.IsNotExist(err) {
			t.Errorf("unreadable state %s neither quarantined nor removed: %v", n, err)
		}
	}
	st, _ := c2.IPAMStatus(context.Background())
	if st.IPv4.Used != 1 {
		t.Fatalf("%d IPv4 addresses allocated after restore, want 1 (ok's): %+v", st.IPv4.Used, st.IPv4.Allocations)
	}
}

// TestRestoreSkipsIntactEndpoints: after a restart, endpoints whose
// datapath still realises the revision their state records come back
// ready without a regeneration; one whose datapath is behind regenerates.
func TestRestoreSkipsIntactEndpoints(t *testing.T) {
	env := newRestoreEnv(t)
	fake := datapath.NewFake(5)
	a, c := env.start(t, fake)
	var eps []*models.Endpoint
	for i := range 4 {
		eps = append(eps, addPod(t, c, fmt.Sprintf("q%d", i), "web", true))
	}
	stop(t, a)
	behind := uint16ID(eps[0].ID)
	rev, ok := fake.Realized(behind)
	if !ok || rev == 0 {
		t.Fatalf("fake has no revision for endpoint %d", behind)
	}
	if _, err := fake.Realize(context.Background(), &endpoint.Endpoint{ID: behind}, rev-1); err != nil {
		t.Fatal(err)
	}
	_, realizes, _ := fake.Stats()

	a2, c2 := env.start(t, fake)
	for i, want := range eps {
		got := waitReady(t, c2, fmt.Sprintf("container-id:q%d", i))
		if got.Identity.ID != want.Identity.ID {
			t.Errorf("q%d: identity %d, want %d", i, got.Identity.ID, want.Identity.ID)
		}
	}
	if n := a2.System.Counters().RegenerationsRun; n != 1 {
		t.Errorf("%d regenerations after restore, want 1 (the endpoint whose datapath was behind)", n)
	}
	if _, after, _ := fake.Stats(); after != realizes+1 {
		t.Errorf("%d datapath realizations after restore, want 1", after-realizes)
	}
	if got, _ := fake.Realized(behind); got <= rev {
		t.Errorf("endpoint %d realised at %d after restore, want above %d", behind, got, rev)
	}
}

// TestRestoreConflictQuarantined: state that reads fine but is refused at
// restore (its address duplicates another endpoint's) is moved to the
// quarantine and counted in the restore stats, GET /v1/status and
// /metrics; a later start does not bring it back.
func TestRestoreConflictQuarantined(t *testing.T) {
	env := newRestoreEnv(t)
	a, c := env.start(t, nil)
	first := addPod(t, c, "first", "a", true)
	dup := addPod(t, c, "dup", "b", true)
	stop(t, a)

	// dup's state now claims first's address (a higher ID: restored after first).
	dir := env.cfg.StateDir
	statePath := filepath.Join(dir, fmt.Sprint(dup.ID), "ep.json")
	data, err := os.ReadFile(statePath)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.ReplaceAll(string(data), `"`+dup.Addressing.IPv4+`"`, `"`+first.Addressing.IPv4+`"`)
	if edited == string(data) {
		t.Fatalf("address %s not found in %s", dup.Addressing.IPv4, data)
	}
	if err := os.WriteFile(statePath, []byte(edited), 0o640); err != nil {
		t.Fatal(err)
	}

	a2, c2 := env.start(t, nil)
	if st := a2.RestoreStats(); st.Restored != 1 || st.Refused != 1 || st.Quarantined != 1 {
		t.Fatalf("restore stats %+v, want 1 restored, 1 refused and quarantined", st)
	}
	waitReady(t, c2, "container-id:first")
	if _, err := os.Stat(filepath.Join(dir, fmt.Sprint(dup.ID))); !os.IsNotExist(err) {
		t.Fatalf("refused state still in the state directory: %v", err)
	}
	q, _ := os.ReadDir(filepath.Join(dir, "quarantine"))
	if len(q) != 1 || !strings.HasPrefix(q[0].Name(), fmt.Sprint(dup.ID)+"-") {
		t.Fatalf("quarantine holds %v, want the refused endpoint's state", q)
	}
	st, err := c2.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Restore == nil || st.Restore.Refused != 1 || st.Restore.Quarantined != 1 || st.Restore.Restored != 1 {
		t.Fatalf("status restore %+v, want 1 restored, 1 refused, 1 quarantined", st.Restore)
	}
	m := httptest.NewRecorder()
	a2.Metrics().Handler().ServeHTTP(m, httptest.NewRequest("GET", "/metrics", nil))
	for _, line := range []string{`membrane_restore_endpoints{result="refused"} 1`, `membrane_restore_endpoints{result="quarantined"} 1`} {
		if !strings.Contains(m.Body.String(), line) {
			t.Errorf("metrics lack %q", line)
		}
	}
	stop(t, a2)

	a3, c3 := env.start(t, nil)
	if st := a3.RestoreStats(); st.Found != 1 || st.Restored != 1 || st.Refused != 0 {
		t.Fatalf("restore stats after another restart %+v, want only first's state", st)
	}
	if _, err := c3.EndpointGet(context.Background(), "container-id:dup"); err == nil {
		t.Fatalf("refused endpoint came back after another restart")
	}
}
