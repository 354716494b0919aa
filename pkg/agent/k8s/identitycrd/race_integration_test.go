package identitycrd_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
	"github.com/membrane-cni/membrane/pkg/agent/k8s/identitycrd"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// The race runs each agent in its own process: this test binary started
// again with childEnv set (TestMain hands it to raceChild), with its own
// client, informer, heartbeat and collector.
const (
	childEnv   = "IDRACE_CHILD"
	raceGrace  = 3 * time.Second
	raceWorker = 8
)

// raceResult is what one agent process reports.
type raceResult struct {
	Node string
	// Phase1 is every label set's number; Phase2 the numbers of the label
	// sets acquired again after every agent released them (while the
	// collectors ran).
	Phase1, Phase2 map[string]identity.NumericIdentity
	// Held is what the agent holds at the end.
	Held map[string]identity.NumericIdentity
	// Seconds is phase 1's wall time; Stats the backend's counters after
	// it, Final at the end (garbage collection ran in between).
	Seconds      float64
	Stats, Final identitycrd.Stats
	// Collected is true when every label set released by all and not
	// acquired again was garbage collected; else Left says what stayed.
	Collected bool
	Left      []leftover
	Err       string
}

// leftover is a released-only label set the agent's cache still held at
// the end of the wait.
type leftover struct {
	Key string
	// Phase1 is its number in phase 1; Numbers the cache's state of that
	// number and of any other number holding the label set.
	Phase1  identity.NumericIdentity
	Numbers []numberState
}

// numberState is the cache's object of a number and the collector's last
// verdict on it.
type numberState struct {
	ID    identity.NumericIdentity
	Cache *v2.MembraneIdentity
	GC    string
}

// raceCount is the number of label sets (IDRACE_COUNT, default 1000).
func raceCount(tb testing.TB) int {
	if s := os.Getenv("IDRACE_COUNT"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 10 || n > 20000 {
			tb.Fatalf("IDRACE_COUNT=%q: want 10..20000", s)
		}
		return n
	}
	return 1000
}

// TestRaceAgents: two, then four agent processes allocate identities for
// the same label sets at once: all agree on every number, and garbage
// collection running in every agent while they release and re-acquire
// never removes an identity one of them holds.
func TestRaceAgents(t *testing.T) {
	e := env(t)
	n := raceCount(t)
	for _, agents := range []int{2, 4} {
		t.Run(fmt.Sprintf("%d-agents", agents), func(t *testing.T) {
			runRace(t, e, agents, n)
		})
	}
}

func runRace(t *testing.T, e *kubetest.Env, agents, n int) {
	kubeconfig := e.Kubeconfig
	dir := t.TempDir()
	prefix := uniq(fmt.Sprintf("race%d", agents))
	// After the agents are killed (cleanups run last first): the next
	// race's collectors would otherwise spend its release phase deleting
	// this race's identities, and none of its label sets acquired again
	// would race them.
	t.Cleanup(func() { removeRace(t, e, prefix, agents) })
	var cmds []*exec.Cmd
	for i := range agents {
		node := fmt.Sprintf("%s-node-%d", prefix, i)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"=1", "IDRACE_KUBECONFIG="+kubeconfig, "IDRACE_NODE="+node,
			"IDRACE_PREFIX="+prefix, "IDRACE_N="+strconv.Itoa(n), "IDRACE_DIR="+dir, "IDRACE_SEED="+strconv.Itoa(i))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	t.Cleanup(func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	})
	waitFiles(t, dir, ".ready", agents)
	if err := os.WriteFile(filepath.Join(dir, "start"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	results := readResults(t, dir, agents)
	defer func() {
		if t.Failed() {
			explain(t, e, dir, results)
		}
	}()
	checkRace(t, results, n, kubeconfig)
	checkReleasedGone(t, e, prefix, n)
	if err := os.WriteFile(filepath.Join(dir, "done"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Errorf("agent process: %v", err)
		}
	}
	report(t, results, agents, n)
}

// TestRaceCheckFollowsLabelSets: a collected identity's number may be
// taken again by another label set whose candidates pass it (both hash to
// the same first candidate), so the race's check that the released label
// sets were collected must look for the label set in the cache, not for
// its old number.
func TestRaceCheckFollowsLabelSets(t *testing.T) {
	e := env(t)
	cfg := noGC(uniq("node-reuse"))
	cfg.GCGrace, cfg.Heartbeat = time.Second, 100*time.Millisecond
	b := newBackend(t, e.Config, cfg)
	released, again, slot := collidingPair(t, e, b)
	ctx := context.Background()
	acq := func(ls labels.Labels) identity.NumericIdentity {
		t.Helper()
		id, _, err := b.Acquire(ctx, ls)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	if id := acq(released); id != slot {
		t.Fatalf("%s: %d, want its first candidate %d", released.Key(), id, slot)
	}
	old := acq(again)
	if old != slot+1 {
		t.Fatalf("%s: %d, want %d (its first candidate %d is taken)", again.Key(), old, slot+1, slot)
	}
	for _, id := range []identity.NumericIdentity{slot, old} {
		if err := b.Release(ctx, id); err != nil {
			t.Fatal(err)
		}
		waitForRelease(t, b, id, cfg.Node)
	}
	marks := identitycrd.NewMarks()
	testutil.Eventually(t, "both identities collected", func() bool {
		if err := b.CollectOnce(ctx, marks); err != nil {
			t.Fatal(err)
		}
		_, cachedSlot := b.CachedUsageForTest(slot)
		_, cachedOld := b.CachedUsageForTest(old)
		return !cachedSlot && !cachedOld
	})
	if id := acq(again); id != slot {
		t.Fatalf("%s acquired again: %d, want the freed first candidate %d", again.Key(), id, slot)
	}
	testutil.Eventually(t, "the cache holds the label set acquired again", func() bool {
		id, ok := b.CachedForTest(again)
		return ok && id == slot
	})
	if left := notCollected(b, []labels.Labels{released}, map[string]identity.NumericIdentity{released.Key(): slot}); len(left) > 0 {
		t.Fatalf("released %s reported not collected: %+v", released.Key(), left)
	}
}

// collidingPair returns two label sets with the same first candidate, a
// number that is free, as is the one after it.
func collidingPair(t *testing.T, e *kubetest.Env, b *identitycrd.Backend) (labels.Labels, labels.Labels, identity.NumericIdentity) {
	t.Helper()
	prefix := uniq("collide")
	bySlot := map[identity.NumericIdentity]labels.Labels{}
	for i := range 100000 {
		ls := mustLabels(t, "k8s:app="+prefix+"-"+strconv.Itoa(i))
		slot := b.SlotForTest(ls)
		first, ok := bySlot[slot]
		if !ok {
			bySlot[slot] = ls
			continue
		}
		if slot < 65535 && getIdentity(t, e.Config, slot) == nil && getIdentity(t, e.Config, slot+1) == nil {
			return first, ls, slot
		}
	}
	t.Fatal("no two label sets with the same free first candidate")
	return nil, nil, 0
}

// removeRace deletes the identities of the race's label sets and its
// agents' leases.
func removeRace(t *testing.T, e *kubetest.Env, prefix string, agents int) {
	dyn, err := dynamic.NewForConfig(e.Config)
	if err != nil {
		t.Error(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res := dyn.Resource(v2.IdentityResource)
	list, err := res.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Errorf("list identities: %v", err)
		return
	}
	names := make(chan string)
	var wg sync.WaitGroup
	for range raceWorker {
		wg.Go(func() {
			for name := range names {
				if err := res.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					t.Errorf("delete identity %s: %v", name, err)
				}
			}
		})
	}
	for _, u := range list.Items {
		app, _, _ := unstructured.NestedString(u.Object, "security-labels", "k8s:app")
		if strings.HasPrefix(app, prefix+"-") {
			names <- u.GetName()
		}
	}
	close(names)
	wg.Wait()
	leases := dyn.Resource(coordinationv1.SchemeGroupVersion.WithResource("leases")).Namespace("kube-system")
	for i := range agents {
		name := fmt.Sprintf("membrane-identity-%s-node-%d", prefix, i)
		if err := leases.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete lease %s: %v", name, err)
		}
	}
}

// waitFiles waits for count files ending in suffix in dir.
func waitFiles(tb testing.TB, dir, suffix string, count int) {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		m, _ := filepath.Glob(filepath.Join(dir, "*"+suffix))
		if len(m) >= count {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%d of %d agents wrote %s", len(m), count, suffix)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func readResults(tb testing.TB, dir string, agents int) []raceResult {
	tb.Helper()
	waitFiles(tb, dir, ".json", agents)
	m, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	var out []raceResult
	for _, f := range m {
		data, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		var r raceResult
		if err := json.Unmarshal(data, &r); err != nil {
			tb.Fatalf("%s: %v", f, err)
		}
		if r.Err != "" {
			tb.Fatalf("agent %s: %s", r.Node, r.Err)
		}
		out = append(out, r)
	}
	return out
}

// checkRace counts disagreements (must be none) and checks that every
// identity an agent holds exists with its labels and the agent's entry.
func checkRace(t *testing.T, results []raceResult, n int, kubeconfig string) {
	disagree := 0
	for _, phase := range []func(raceResult) map[string]identity.NumericIdentity{
		func(r raceResult) map[string]identity.NumericIdentity { return r.Phase1 },
		func(r raceResult) map[string]identity.NumericIdentity { return r.Phase2 },
	} {
		first := phase(results[0])
		for _, r := range results[1:] {
			for key, id := range phase(r) {
				if want, ok := first[key]; ok && want != id {
					disagree++
					if disagree <= 5 {
						t.Errorf("%s: %s got %d, %s got %d", key, results[0].Node, want, r.Node, id)
					}
				}
			}
		}
	}
	if disagree > 0 {
		t.Fatalf("%d disagreements", disagree)
	}
	if len(results[0].Phase1) != n {
		t.Fatalf("phase 1 acquired %d label sets, want %d", len(results[0].Phase1), n)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	missing := 0
	for _, r := range results {
		if !r.Collected {
			t.Errorf("%s: the label sets every agent released were not all collected", r.Node)
		}
		for key, id := range r.Held {
			mi := getIdentity(t, rc, id)
			if mi == nil || keyOf(mi) != key || mi.Usage[r.Node] == "" {
				missing++
				if missing <= 5 {
					t.Errorf("%s holds %d (%s): object %+v", r.Node, id, key, mi)
				}
			}
		}
	}
	if missing > 0 {
		t.Fatalf("%d held identities missing or not marked used", missing)
	}
}

// checkReleasedGone checks that the API server holds none of the
// released-only label sets (the agents saw them gone from their caches).
func checkReleasedGone(t *testing.T, e *kubetest.Env, prefix string, n int) {
	sets, err := raceSets(prefix, n)
	if err != nil {
		t.Fatal(err)
	}
	released := map[string]bool{}
	for i, ls := range sets {
		if releasedOnly(i) {
			released[ls.Key()] = true
		}
	}
	dyn, err := dynamic.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	list, err := dyn.Resource(v2.IdentityResource).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		mi := &v2.MembraneIdentity{}
		if err := fromUnstructured(&list.Items[i], mi); err != nil {
			t.Fatal(err)
		}
		if released[keyOf(mi)] {
			t.Errorf("the API server still holds released %s: %s", keyOf(mi), describe(mi))
		}
	}
}

// report logs the numbers (and appends them to $IDENTITY_BENCH_OUT).
func report(t *testing.T, results []raceResult, agents, n int) {
	var slowest float64
	var conflicts, created, adopted, retries, collected, gcConflicts, recreated uint64
	for _, r := range results {
		recreated += r.Final.Created - r.Stats.Created
		slowest = max(slowest, r.Seconds)
		conflicts += r.Stats.Conflicts
		created += r.Stats.Created
		adopted += r.Stats.Adopted
		retries += r.Stats.Retries
		collected += r.Final.Collected
		gcConflicts += r.Final.GCConflicts
	}
	// Numbers of released label sets that a label set acquired again
	// took (its candidates passed them in phase 1, both were collected
	// before it came back).
	again := map[identity.NumericIdentity]bool{}
	for _, r := range results {
		for _, id := range r.Phase2 {
			again[id] = true
		}
	}
	reused := 0
	for key, id := range results[0].Phase1 {
		if _, held := results[0].Held[key]; !held && again[id] {
			reused++
		}
	}
	load, _ := os.ReadFile("/proc/loadavg")
	line := fmt.Sprintf("agents=%d label-sets=%d phase1=%.2fs allocations/s=%.0f created=%d adopted=%d conflicts=%d retries=%d (phase 1) gc-collected=%d gc-refused=%d created-again=%d released-numbers-taken-again=%d (whole run) disagreements=0 loadavg=%s",
		agents, n, slowest, float64(agents*n)/slowest, created, adopted, conflicts, retries, collected, gcConflicts, recreated, reused, strings.TrimSpace(string(load)))
	t.Log(line)
	if out := os.Getenv("IDENTITY_BENCH_OUT"); out != "" {
		f, err := os.OpenFile(out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fmt.Fprintln(f, line)
	}
}

// raceChild is one agent process of the race; its result goes to
// $IDRACE_DIR/<node>.json. It exits once $IDRACE_DIR/done exists.
func raceChild() int {
	dir, node := os.Getenv("IDRACE_DIR"), os.Getenv("IDRACE_NODE")
	res := raceResult{Node: node}
	if err := runChild(&res); err != nil {
		res.Err = err.Error()
	}
	data, _ := json.Marshal(res)
	tmp := filepath.Join(dir, node+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := os.Rename(tmp, filepath.Join(dir, node+".json")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Stay alive (heartbeat) until the parent checked the store.
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(dir, "done")); err == nil {
			return 0
		}
	}
	return 1
}

func runChild(res *raceResult) error {
	dir := os.Getenv("IDRACE_DIR")
	n, _ := strconv.Atoi(os.Getenv("IDRACE_N"))
	seed, _ := strconv.Atoi(os.Getenv("IDRACE_SEED"))
	rc, err := clientcmd.BuildConfigFromFlags("", os.Getenv("IDRACE_KUBECONFIG"))
	if err != nil {
		return err
	}
	rc.QPS, rc.Burst = 200, 400
	logf, err := os.Create(filepath.Join(dir, res.Node+".log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	b, err := identitycrd.New(rc, identitycrd.Config{Node: res.Node, GCGrace: raceGrace, GCInterval: 200 * time.Millisecond,
		Heartbeat: raceGrace / 10}, slog.New(slog.NewTextHandler(logf, nil)))
	if err != nil {
		return err
	}
	defer b.Close()
	for deadline := time.Now().Add(time.Minute); !b.SyncedForTest(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return errors.New("identity informer not synced")
		}
	}
	if err := os.WriteFile(filepath.Join(dir, res.Node+".ready"), nil, 0o600); err != nil {
		return err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "start")); err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	sets, err := raceSets(os.Getenv("IDRACE_PREFIX"), n)
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 14))
	order := rng.Perm(n)
	start := time.Now()
	res.Phase1, err = acquireAll(b, sets, order, nil)
	if err != nil {
		return err
	}
	res.Seconds, res.Stats = time.Since(start).Seconds(), b.Stats()
	err = churn(b, sets, rng, res)
	res.Final = b.Stats()
	return err
}

// churn releases every fifth label set, acquires every tenth again at
// random moments within twice the grace period (so some land as the
// collectors delete), and waits until the released-only ones are gone.
func churn(b *identitycrd.Backend, sets []labels.Labels, rng *rand.Rand, res *raceResult) error {
	ctx := context.Background()
	res.Held = make(map[string]identity.NumericIdentity)
	var again []int
	for i, ls := range sets {
		key := ls.Key()
		if i%5 != 0 {
			res.Held[key] = res.Phase1[key]
			continue
		}
		if err := b.Release(ctx, res.Phase1[key]); err != nil {
			return err
		}
		if i%10 == 0 {
			again = append(again, i)
		}
	}
	delays := make(map[int]time.Duration, len(again))
	for _, i := range again {
		delays[i] = time.Duration(rng.Int64N(int64(2 * raceGrace)))
	}
	slices.SortFunc(again, func(x, y int) int { return cmp.Compare(delays[x], delays[y]) })
	var err error
	res.Phase2, err = acquireAll(b, sets, again, delays)
	if err != nil {
		return err
	}
	for key, id := range res.Phase2 {
		res.Held[key] = id
	}
	// The released-only label sets must be collected (by some agent).
	var released []labels.Labels
	for i, ls := range sets {
		if releasedOnly(i) {
			released = append(released, ls)
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		left := notCollected(b, released, res.Phase1)
		if len(left) == 0 {
			res.Collected = true
			return nil
		}
		if time.Now().After(deadline) {
			res.Left = left
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// raceSets are the race's label sets.
func raceSets(prefix string, n int) ([]labels.Labels, error) {
	sets := make([]labels.Labels, n)
	for i := range sets {
		var err error
		if sets[i], err = labels.ParseSet([]string{"k8s:app=" + prefix + "-" + strconv.Itoa(i), "k8s:io.kubernetes.pod.namespace=race"}); err != nil {
			return nil, err
		}
	}
	return sets, nil
}

// releasedOnly reports whether the race releases label set i and does not
// acquire it again.
func releasedOnly(i int) bool { return i%5 == 0 && i%10 != 0 }

// notCollected returns the released label sets the cache still holds,
// with the cache's objects and the collector's verdicts. It looks for the
// label set, not for its number: once collected, the number may be taken
// by another label set whose candidates pass it (acquired again in phase
// 2).
func notCollected(b *identitycrd.Backend, released []labels.Labels, phase1 map[string]identity.NumericIdentity) []leftover {
	var out []leftover
	for _, ls := range released {
		held, ok := b.CachedForTest(ls)
		if !ok {
			continue
		}
		id := phase1[ls.Key()]
		l := leftover{Key: ls.Key(), Phase1: id}
		ids := []identity.NumericIdentity{held}
		if held != id {
			ids = append(ids, id)
		}
		for _, id := range ids {
			l.Numbers = append(l.Numbers, numberState{ID: id, Cache: b.CachedObjectForTest(id), GC: b.GCVerdictForTest(id)})
		}
		out = append(out, l)
	}
	return out
}

// acquireAll acquires sets[i] for i in order with raceWorker goroutines,
// each after its delay (if any).
func acquireAll(b *identitycrd.Backend, sets []labels.Labels, order []int, delays map[int]time.Duration) (map[string]identity.NumericIdentity, error) {
	var mu sync.Mutex
	out := make(map[string]identity.NumericIdentity, len(order))
	var firstErr error
	work := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for range raceWorker {
		wg.Go(func() {
			for i := range work {
				if d, ok := delays[i]; ok {
					time.Sleep(time.Until(start.Add(d)))
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				id, _, err := b.Acquire(ctx, sets[i])
				cancel()
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				out[sets[i].Key()] = id
				mu.Unlock()
			}
		})
	}
	for _, i := range order {
		work <- i
	}
	close(work)
	wg.Wait()
	return out, firstErr
}

// explain logs, for each label set an agent reported not collected, each
// number's object in the API server against the agent's cache and the
// agent's collector's verdict, every object the API server holds for the
// label set, the agents' log lines about those numbers (and their
// warnings), and the end of the API server's log.
func explain(t *testing.T, e *kubetest.Env, dir string, results []raceResult) {
	dyn, err := dynamic.NewForConfig(e.Config)
	if err != nil {
		t.Log(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	list, err := dyn.Resource(v2.IdentityResource).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("list identities: %v", err)
		return
	}
	byKey := map[string][]string{}
	server := map[string]*v2.MembraneIdentity{}
	for i := range list.Items {
		mi := &v2.MembraneIdentity{}
		if err := fromUnstructured(&list.Items[i], mi); err != nil {
			continue
		}
		server[mi.Name] = mi
		byKey[keyOf(mi)] = append(byKey[keyOf(mi)], mi.Name)
	}
	// Which label set each agent acquired in phase 2 holds which number.
	phase2 := map[identity.NumericIdentity]string{}
	for _, r := range results {
		for key, id := range r.Phase2 {
			phase2[id] = key
		}
	}
	wanted := map[string]bool{}
	for _, r := range results {
		t.Logf("%s: %d released-only label sets still in its cache (list at resourceVersion %s)", r.Node, len(r.Left), list.GetResourceVersion())
		for i, l := range r.Left {
			if i == 10 {
				t.Logf("  ... %d more", len(r.Left)-i)
				break
			}
			t.Logf("  %s: phase-1 number %d; the API server holds it at %v", l.Key, l.Phase1, byKey[l.Key])
			for _, ns := range l.Numbers {
				wanted[strconv.Itoa(int(ns.ID))] = true
				t.Logf("    %d in the API server: %s", ns.ID, describe(server[strconv.Itoa(int(ns.ID))]))
				t.Logf("    %d in the cache:      %s", ns.ID, describe(ns.Cache))
				if k, ok := phase2[ns.ID]; ok {
					t.Logf("    %d is the phase-2 number of %s", ns.ID, k)
				}
				t.Logf("    %d collector: %s", ns.ID, ns.GC)
			}
		}
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, f := range logs {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		warns := 0
		for line := range strings.Lines(string(data)) {
			_, after, ok := strings.Cut(line, " identity=")
			id, _, _ := strings.Cut(after, " ")
			switch {
			case ok && wanted[strings.TrimSpace(id)]:
			case strings.Contains(line, "level=WARN") && warns < 20:
				warns++
			default:
				continue
			}
			t.Logf("%s: %s", filepath.Base(f), strings.TrimSpace(line))
		}
	}
	data, err := os.ReadFile(filepath.Join(e.Dir, "apiserver.log"))
	if err != nil {
		t.Log(err)
		return
	}
	// The harness's API server complains every 10 s that its endpoint is
	// a loopback address: not about the race.
	var lines []string
	for line := range strings.Lines(string(data)) {
		if !strings.Contains(line, `"kubernetes"`) {
			lines = append(lines, strings.TrimRight(line, "\n"))
		}
	}
	t.Logf("the last %d lines of %s but its endpoint complaints (kept with KUBETEST_KEEP=1):\n%s", min(len(lines), 40),
		filepath.Join(e.Dir, "apiserver.log"), strings.Join(lines[max(0, len(lines)-40):], "\n"))
}

// describe is an identity object's labels, version, usage and probe.
func describe(mi *v2.MembraneIdentity) string {
	if mi == nil {
		return "absent"
	}
	del := ""
	if mi.DeletionTimestamp != nil {
		del = " deleting since " + mi.DeletionTimestamp.String()
	}
	return fmt.Sprintf("%s rv %s uid %s usage %v probed %q%s", keyOf(mi), mi.ResourceVersion, mi.UID, mi.Usage,
		mi.Annotations[identitycrd.ProbedAnnotation], del)
}
