package identitycrd_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

	"k8s.io/client-go/tools/clientcmd"

	"github.com/membrane-cni/membrane/pkg/agent/k8s/identitycrd"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
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
	// acquired again was garbage collected.
	Collected bool
	Err       string
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
			runRace(t, e.Kubeconfig, agents, n)
		})
	}
}

func runRace(t *testing.T, kubeconfig string, agents, n int) {
	dir := t.TempDir()
	prefix := uniq(fmt.Sprintf("race%d", agents))
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
	checkRace(t, results, n, kubeconfig)
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

// report logs the numbers (and appends them to $IDENTITY_BENCH_OUT).
func report(t *testing.T, results []raceResult, agents, n int) {
	var slowest float64
	var conflicts, created, adopted, retries, collected, gcConflicts uint64
	for _, r := range results {
		slowest = max(slowest, r.Seconds)
		conflicts += r.Stats.Conflicts
		created += r.Stats.Created
		adopted += r.Stats.Adopted
		retries += r.Stats.Retries
		collected += r.Final.Collected
		gcConflicts += r.Final.GCConflicts
	}
	load, _ := os.ReadFile("/proc/loadavg")
	line := fmt.Sprintf("agents=%d label-sets=%d phase1=%.2fs allocations/s=%.0f created=%d adopted=%d conflicts=%d retries=%d (phase 1) gc-collected=%d gc-refused=%d (whole run) disagreements=0 loadavg=%s",
		agents, n, slowest, float64(agents*n)/slowest, created, adopted, conflicts, retries, collected, gcConflicts, strings.TrimSpace(string(load)))
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
	b, err := identitycrd.New(rc, identitycrd.Config{Node: res.Node, GCGrace: raceGrace, GCInterval: 200 * time.Millisecond,
		Heartbeat: raceGrace / 10}, slog.New(slog.NewTextHandler(io.Discard, nil)))
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
	sets := make([]labels.Labels, n)
	prefix := os.Getenv("IDRACE_PREFIX")
	for i := range sets {
		if sets[i], err = labels.ParseSet([]string{"k8s:app=" + prefix + "-" + strconv.Itoa(i), "k8s:io.kubernetes.pod.namespace=race"}); err != nil {
			return err
		}
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
	deadline := time.Now().Add(2 * time.Minute)
	for {
		gone := true
		for i, ls := range sets {
			if i%5 == 0 && i%10 != 0 {
				if _, ok := b.CachedUsageForTest(res.Phase1[ls.Key()]); ok {
					gone = false
					break
				}
			}
		}
		if gone {
			res.Collected = true
			return nil
		}
		if time.Now().After(deadline) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
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
