package crash

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/restore"
)

// podState is what the test knows about a pod's attachment.
type podState int

const (
	podAdding   podState = iota // ADD in flight
	podLive                     // ADD answered success, no DEL yet
	podDeleting                 // DEL in flight
	podGone                     // DEL answered success
	podQueued                   // DEL made while the agent was down (queued)
	podUnknown                  // the agent died under the ADD or DEL: resolved after restart
)

// pod is one attachment of the churn.
type pod struct {
	name, containerID string
	state             podState
	ns                *testutil.NS // linux runs: the pod's netns
}

// driver performs ADDs and DELs against the agent (through pkg/clients/client or
// the CNI plugin).
type driver interface {
	add(ctx context.Context, p *pod) error
	del(ctx context.Context, p *pod) error
	// delDown runs a DEL while the agent is down (it must be queued).
	delDown(p *pod)
}

// world is the test's model of every pod it ever made.
type world struct {
	mu   sync.Mutex // guards pods and next
	pods []*pod
	next int
	rng  *rand.Rand
}

func newWorld(seed uint64) *world { return &world{rng: rand.New(rand.NewPCG(seed, 7))} }

func (w *world) newPod() *pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.next++
	p := &pod{name: fmt.Sprintf("p%d", w.next), containerID: "c" + testutil.RandomSuffix(24), state: podAdding}
	w.pods = append(w.pods, p)
	return p
}

// pickLive marks a random live pod deleting and returns it (nil if none).
func (w *world) pickLive(state podState) *pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	var live []*pod
	for _, p := range w.pods {
		if p.state == podLive {
			live = append(live, p)
		}
	}
	if len(live) == 0 {
		return nil
	}
	p := live[w.rng.IntN(len(live))]
	p.state = state
	return p
}

func (w *world) set(p *pod, s podState) {
	w.mu.Lock()
	p.state = s
	w.mu.Unlock()
}

func (w *world) chance(pct int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rng.IntN(100) < pct
}

func (w *world) intN(n int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rng.IntN(n)
}

// maxLive bounds the live pods of a churn (the pools are /24s).
const maxLive = 64

func (w *world) addChance() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	live := 0
	for _, p := range w.pods {
		if p.state == podLive || p.state == podAdding {
			live++
		}
	}
	if live >= maxLive {
		return 30
	}
	return 60
}

// churn runs workers doing ADDs (60%, 30% beyond maxLive pods) and DELs
// until ctx ends. An operation that fails leaves its pod unknown: the
// agent may have died under it.
func (w *world) churn(ctx context.Context, d driver, workers int) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if w.chance(w.addChance()) {
					p := w.newPod()
					if err := d.add(ctx, p); err != nil {
						w.set(p, podUnknown)
						continue
					}
					w.set(p, podLive)
				} else if p := w.pickLive(podDeleting); p != nil {
					if err := d.del(ctx, p); err != nil {
						w.set(p, podUnknown)
						continue
					}
					w.set(p, podGone)
				}
			}
		}()
	}
	return &wg
}

// persisted returns the endpoint IDs that have durable state, as the
// next start finds them (restore.Persisted: the directories, and the
// journal's records the directories do not hold yet).
func persisted(t *testing.T, dir string) map[int]bool {
	t.Helper()
	ps, err := restore.Persisted(dir)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[int]bool{}
	for id := range ps {
		ids[int(id)] = true
	}
	return ids
}

// checkRestart checks, after a restart, everything restore promises:
//   - no state directory was quarantined (writes are atomic);
//   - every endpoint that had state comes back ready or is deleted;
//   - every pod whose ADD succeeded (and no DEL since) is back and ready,
//     every pod whose DEL succeeded or was queued while the agent was
//     down is gone; pods the agent died under are resolved;
//   - every endpoint has its state directory;
//   - no address is held twice and every allocated address belongs to an
//     endpoint (no pending allocation survives a restart).
func checkRestart(t *testing.T, c *client.Client, w *world, stateDir string, before map[int]bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if q, _ := os.ReadDir(filepath.Join(stateDir, "quarantine")); len(q) > 0 {
		t.Fatalf("%d state directories quarantined after a crash: %s", len(q), q[0].Name())
	}
	for id := range before {
		ep, err := waitSettled(ctx, c, strconv.Itoa(id))
		if err != nil {
			t.Fatalf("endpoint %d (persisted): %v", id, err)
		}
		if ep != nil && ep.State != "ready" {
			t.Fatalf("endpoint %d (persisted) came back %s: %s", id, ep.State, ep.LastError)
		}
	}
	w.mu.Lock()
	pods := append([]*pod(nil), w.pods...)
	w.mu.Unlock()
	for _, p := range pods {
		ep, err := waitSettled(ctx, c, "container-id:"+p.containerID)
		if err != nil {
			t.Fatalf("pod %s: %v", p.name, err)
		}
		switch p.state {
		case podLive:
			if ep == nil || ep.State != "ready" {
				t.Fatalf("pod %s: ADD succeeded before the crash, endpoint after restart: %+v", p.name, ep)
			}
		case podGone, podQueued:
			if ep != nil {
				t.Fatalf("pod %s: deleted (state %d) before the restart, endpoint %d is back", p.name, p.state, ep.ID)
			}
		case podUnknown:
			if ep != nil && ep.State != "ready" {
				t.Fatalf("pod %s: came back %s", p.name, ep.State)
			}
			if ep != nil {
				w.set(p, podLive)
			} else {
				w.set(p, podGone)
			}
		default:
			t.Fatalf("pod %s in state %d after the churn stopped", p.name, p.state)
		}
	}
	checkAddresses(t, ctx, c, stateDir)
}

// waitSettled returns the endpoint once it is ready (or nil once it is
// gone); a restoring endpoint is waited for.
func waitSettled(ctx context.Context, c *client.Client, ref string) (*models.Endpoint, error) {
	for {
		ep, err := c.EndpointGet(ctx, ref)
		switch {
		case client.IsNotFound(err):
			return nil, nil
		case err != nil:
			return nil, err
		case ep.State == "ready" || ctx.Err() != nil:
			return ep, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// healthOwner owns the health endpoint's address while the agent
// replaces the previous agent's health endpoint (in the background after
// a restart): the one allocation allowed without an endpoint.
const healthOwner = "membrane/membrane-health"

// checkAddresses: endpoints hold distinct addresses, each allocated to
// that endpoint; no other address is allocated (but the health
// endpoint's during its replacement); every endpoint has state.
func checkAddresses(t *testing.T, ctx context.Context, c *client.Client, stateDir string) {
	t.Helper()
	eps, err := c.EndpointList(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.IPAMStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byIP := map[string]int64{}
	onDisk := persisted(t, stateDir)
	for _, ep := range eps {
		ip := ep.Addressing.IPv4
		if other, dup := byIP[ip]; dup {
			t.Fatalf("address %s held by endpoints %d and %d", ip, other, ep.ID)
		}
		byIP[ip] = ep.ID
		// The health endpoint that replaces the previous agent's is
		// created in the background: until its first regeneration ends
		// (it becomes ready) its state may not be written yet.
		creatingHealth := ep.K8sNamespace+"/"+ep.K8sPodName == healthOwner && ep.State != "ready"
		if !onDisk[int(ep.ID)] && !creatingHealth {
			t.Fatalf("endpoint %d (%s/%s, %s) has no state directory", ep.ID, ep.K8sNamespace, ep.K8sPodName, ep.State)
		}
	}
	seen := map[string]bool{}
	unboundHealth := 0
	for _, al := range st.IPv4.Allocations {
		if seen[al.IP] {
			t.Fatalf("address %s allocated twice", al.IP)
		}
		// The health endpoint's address during its replacement: not
		// claimed yet (Endpoint 0), or still claimed by the previous
		// health endpoint, whose row is gone while its release commits.
		if _, bound := byIP[al.IP]; al.Owner == healthOwner && !bound {
			if unboundHealth++; unboundHealth > 1 {
				t.Fatalf("health addresses without an endpoint: %+v and another", al)
			}
			continue
		}
		seen[al.IP] = true
		if id, ok := byIP[al.IP]; !ok || id != al.Endpoint {
			t.Fatalf("allocation %+v belongs to no endpoint (endpoint holding it: %d)", al, id)
		}
	}
	if len(seen) != len(byIP) {
		t.Fatalf("%d endpoints hold addresses but %d are allocated", len(byIP), len(seen))
	}
}

// summary counts the pods per state, for the test log.
func (w *world) summary() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := map[podState]int{}
	for _, p := range w.pods {
		n[p.state]++
	}
	return fmt.Sprintf("%d pods: %d live, %d deleted, %d deleted while the agent was down", len(w.pods), n[podLive], n[podGone], n[podQueued])
}
