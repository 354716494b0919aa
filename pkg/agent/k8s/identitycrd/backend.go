// Package identitycrd is the Kubernetes identity.ClusterBackend: every
// cluster-wide identity is a cluster-scoped MembraneIdentity object whose
// name is the number and which holds the label set (Cilium's CRD identity
// allocation mode).
//
// Allocation is create-with-name. A label set's candidate numbers are a
// fixed probe sequence from a hash of the label set, the same on every
// node. Each candidate is created, or, when it exists, touched (an
// annotation write whose answer carries its labels): the same labels are
// adopted, others move to the next candidate. Racing agents therefore
// try the same names in the same order and agree; the touch keeps a
// skipped candidate from being collected while they race (see claim). A
// label set already in the cache (indexer by label-set key) is adopted
// directly.
//
// Use marking: the object's usage map holds one entry per node using the
// identity (node name -> time it took its reference), written with a JSON
// patch that tests the labels in the same request, so a node never marks
// an identity that changed under it. Release removes the entry. Each node
// renews a coordination.k8s.io Lease (its heartbeat) whose acquireTime is
// the start of the node's agent: an entry counts while its node's lease is
// fresh and the entry was written by the current agent (its time is not
// older than acquireTime).
//
// Garbage collection (every agent runs it; it is idempotent): an identity
// without a counting entry, seen unchanged (same resourceVersion) for the
// grace period, is deleted with a resourceVersion precondition. Any
// Acquire that marks it in between changes its resourceVersion, so the
// delete fails; an Acquire whose mark comes after the delete gets
// NotFound and allocates again. So GC never removes an identity whose
// Acquire returned.
package identitycrd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// ErrInvalidConfig is wrapped by Config validation errors.
var ErrInvalidConfig = errors.New("invalid identity CRD backend config")

// LeaseLabel marks the heartbeat leases of the backend.
const LeaseLabel = "membrane.io/identity-heartbeat"

// Config configures a Backend.
type Config struct {
	// Node is this node's name: its usage entries and its lease.
	Node string
	// LeaseNamespace holds the nodes' heartbeat leases (default kube-system).
	LeaseNamespace string
	// GCGrace is how long an identity stays unused before it is removed,
	// and how long a node's heartbeat may be late before its entries stop
	// counting (default 15 min).
	GCGrace time.Duration
	// GCInterval is the time between garbage collection passes (default
	// 1 min); negative disables this agent's collector.
	GCInterval time.Duration
	// Heartbeat is the time between lease renewals (default GCGrace/3,
	// at most 30 s).
	Heartbeat time.Duration
	// MinID and MaxID bound the numbers handed out (default 256..65535).
	MinID, MaxID identity.NumericIdentity
	// MaxAttempts bounds the candidates one Acquire tries (default 256).
	MaxAttempts int
}

func (c Config) withDefaults() Config {
	if c.LeaseNamespace == "" {
		c.LeaseNamespace = "kube-system"
	}
	if c.GCGrace == 0 {
		c.GCGrace = 15 * time.Minute
	}
	if c.GCInterval == 0 {
		c.GCInterval = time.Minute
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = min(c.GCGrace/3, 30*time.Second)
	}
	if c.MinID == 0 {
		c.MinID = identity.MinLocalIdentity
	}
	if c.MaxID == 0 {
		c.MaxID = 65535
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 256
	}
	return c
}

// Validate names the bad field.
func (c Config) Validate() error {
	c = c.withDefaults()
	if errs := validation.IsDNS1123Subdomain(c.Node); len(errs) > 0 {
		return fmt.Errorf("node %q: %s: %w", c.Node, errs[0], ErrInvalidConfig)
	}
	if errs := validation.IsDNS1123Label(c.LeaseNamespace); len(errs) > 0 {
		return fmt.Errorf("lease namespace %q: %s: %w", c.LeaseNamespace, errs[0], ErrInvalidConfig)
	}
	switch {
	case c.GCGrace < 0 || c.Heartbeat < 0:
		return fmt.Errorf("GCGrace %v, Heartbeat %v: negative: %w", c.GCGrace, c.Heartbeat, ErrInvalidConfig)
	case c.Heartbeat >= c.GCGrace:
		return fmt.Errorf("heartbeat %v must be shorter than the GC grace %v: %w", c.Heartbeat, c.GCGrace, ErrInvalidConfig)
	case c.MinID < identity.MinLocalIdentity || c.MaxID < c.MinID || c.MaxID > 65535:
		return fmt.Errorf("identity range %d..%d outside %d..65535: %w", c.MinID, c.MaxID, identity.MinLocalIdentity, ErrInvalidConfig)
	case c.MaxAttempts < 1:
		return fmt.Errorf("MaxAttempts %d: %w", c.MaxAttempts, ErrInvalidConfig)
	}
	return nil
}

// Stats counts the backend's work (benchmarks, tests).
type Stats struct {
	// Created counts identities this backend created; Adopted counts
	// Acquires answered with an existing identity.
	Created, Adopted uint64
	// Conflicts counts Creates answered AlreadyExists (another agent won
	// the name, or other labels hold it); Retries counts identities found
	// in the cache whose mark failed (deleted or changed meanwhile).
	Conflicts, Retries uint64
	// Collected counts identities this agent's GC deleted; GCConflicts
	// counts GC deletes refused because the identity changed (a
	// concurrent Acquire).
	Collected, GCConflicts uint64
}

// Backend is the MembraneIdentity identity.ClusterBackend.
type Backend struct {
	cfg      Config
	res      dynamic.ResourceInterface
	cs       kubernetes.Interface
	informer cache.SharedIndexInformer
	log      *slog.Logger
	// start is when this agent's backend started (the lease's acquireTime):
	// entries written before it are a previous agent's.
	start time.Time
	// marks are the collector's, with its last verdict on each identity.
	marks  *Marks
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	status identity.ClusterStatus
	owner  metav1.OwnerReference // the lease's owner, this node's Node, once read (leaseOwner)

	created, adopted, conflicts, retries, collected, gcConflicts atomic.Uint64
}

var _ identity.PreferringBackend = (*Backend)(nil)

// labelsIndex is the informer index by label-set key.
const labelsIndex = "labels"

// New starts a backend on the API server of rc: the identity informer,
// the heartbeat and (unless disabled) the collector. It does not wait
// for the API server.
func New(rc *rest.Config, cfg Config, log *slog.Logger) (*Backend, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("identity CRD backend: %w", err)
	}
	cfg = cfg.withDefaults()
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("identity CRD backend: %w", err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("identity CRD backend: %w", err)
	}
	b := &Backend{cfg: cfg, res: dyn.Resource(v2.IdentityResource), cs: cs, log: log.With("component", "identity-crd"),
		start: time.Now().Truncate(time.Microsecond), marks: NewMarks(),
		status: identity.ClusterStatus{Backend: "kubernetes", Since: time.Now()}}
	b.informer = dynamicinformer.NewFilteredDynamicInformer(dyn, v2.IdentityResource, "", 0,
		cache.Indexers{labelsIndex: labelsIndexFunc}, nil).Informer()
	if err := b.informer.SetTransform(toIdentity); err != nil {
		return nil, fmt.Errorf("identity CRD backend: %w", err)
	}
	if err := b.informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		b.watchError(err)
	}); err != nil {
		return nil, fmt.Errorf("identity CRD backend: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	b.wg.Go(func() { b.informer.RunWithContext(ctx) })
	b.wg.Go(func() { b.heartbeat(ctx) })
	if cfg.GCInterval > 0 {
		b.wg.Go(func() { b.collect(ctx) })
	}
	return b, nil
}

// Close stops the informer, the heartbeat and the collector.
func (b *Backend) Close() error {
	b.cancel()
	b.wg.Wait()
	return nil
}

// Stats returns the counters.
func (b *Backend) Stats() Stats {
	return Stats{Created: b.created.Load(), Adopted: b.adopted.Load(), Conflicts: b.conflicts.Load(), Retries: b.retries.Load(),
		Collected: b.collected.Load(), GCConflicts: b.gcConflicts.Load()}
}

// Status implements identity.ClusterBackend.
func (b *Backend) Status() identity.ClusterStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.status
	st.Synced = b.informer.HasSynced()
	return st
}

// watchError is the informer's watch error handler: a watch that failed
// marks the store unhealthy, except the routine ends the reflector
// handles by itself (a watch closed by the server, a resourceVersion
// compacted away: it lists again), which say nothing of the store.
func (b *Backend) watchError(err error) {
	if errors.Is(err, io.EOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return
	}
	b.setHealth(err)
}

// setHealth records the outcome of a call to the API server (the calls
// handle the answers that are part of the protocol, such as not found
// and conflicts, themselves; a 404 that reaches here means the CRD is not
// served). A cancelled call says nothing.
func (b *Backend) setHealth(err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	healthy := err == nil
	if healthy != b.status.Healthy {
		b.status.Healthy, b.status.Since = healthy, time.Now()
	}
	if err != nil {
		b.status.LastError = err.Error()
	}
}

// toIdentity converts the informer's objects to *v2.MembraneIdentity (a
// malformed object becomes one without labels, which nothing indexes).
func toIdentity(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	mi := &v2.MembraneIdentity{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, mi); err != nil {
		mi = &v2.MembraneIdentity{ObjectMeta: metav1.ObjectMeta{Name: u.GetName(), ResourceVersion: u.GetResourceVersion(), UID: u.GetUID()}}
	}
	return mi, nil
}

// decode returns the number and labels of an object; false when it is
// not a valid identity.
func decode(mi *v2.MembraneIdentity) (identity.NumericIdentity, labels.Labels, bool) {
	n, err := strconv.ParseUint(mi.Name, 10, 32)
	if err != nil || strconv.FormatUint(n, 10) != mi.Name || n < uint64(identity.MinLocalIdentity) || n > 65535 {
		return 0, nil, false
	}
	ls, err := fromSecurityLabels(mi.SecurityLabels)
	if err != nil || len(ls) == 0 {
		return 0, nil, false
	}
	return identity.NumericIdentity(n), ls, true
}

func labelsIndexFunc(obj any) ([]string, error) {
	mi, ok := obj.(*v2.MembraneIdentity)
	if !ok {
		return nil, nil
	}
	if _, ls, ok := decode(mi); ok {
		return []string{ls.Key()}, nil
	}
	return nil, nil
}

// toSecurityLabels is ls as "source:key" -> value.
func toSecurityLabels(ls labels.Labels) map[string]string {
	m := make(map[string]string, len(ls))
	for _, l := range ls {
		m[l.Source+":"+l.Key] = l.Value
	}
	return m
}

// fromSecurityLabels parses the security-labels map.
func fromSecurityLabels(m map[string]string) (labels.Labels, error) {
	out := make([]labels.Label, 0, len(m))
	for k, v := range m {
		src, key, ok := strings.Cut(k, ":")
		if !ok {
			return nil, fmt.Errorf("security label %q: no source: %w", labels.Clip(k), labels.ErrInvalidLabel)
		}
		out = append(out, labels.Label{Source: src, Key: key, Value: v})
	}
	return labels.New(out...)
}

// Watch implements identity.ClusterBackend.
func (b *Backend) Watch(ctx context.Context, fn func(identity.ClusterEvent)) error {
	var mu sync.Mutex // fn is called from the handler's goroutine and, once, from this one
	call := func(ev identity.ClusterEvent) {
		mu.Lock()
		defer mu.Unlock()
		fn(ev)
	}
	upsert := func(obj any) {
		if mi, ok := obj.(*v2.MembraneIdentity); ok {
			if id, ls, ok := decode(mi); ok {
				call(identity.ClusterEvent{Kind: identity.ClusterUpsert, ID: id, Labels: ls})
			}
		}
	}
	reg, err := b.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: upsert,
		UpdateFunc: func(oldObj, newObj any) {
			o, _ := oldObj.(*v2.MembraneIdentity)
			n, _ := newObj.(*v2.MembraneIdentity)
			if o == nil || n == nil || !maps.Equal(o.SecurityLabels, n.SecurityLabels) {
				upsert(newObj) // usage changes are not identity changes
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if mi, ok := obj.(*v2.MembraneIdentity); ok {
				if id, _, ok := decode(mi); ok {
					call(identity.ClusterEvent{Kind: identity.ClusterDelete, ID: id})
				}
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watch identities: %w", err)
	}
	defer func() { _ = b.informer.RemoveEventHandler(reg) }()
	if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		return ctx.Err()
	}
	call(identity.ClusterEvent{Kind: identity.ClusterSynced})
	<-ctx.Done()
	return nil
}

// Acquire implements identity.ClusterBackend.
func (b *Backend) Acquire(ctx context.Context, ls labels.Labels) (identity.NumericIdentity, bool, error) {
	return b.acquirePreferring(ctx, ls, identity.IdentityUnknown)
}

// AcquirePreferred implements identity.PreferringBackend: a label set no
// object holds is created with preferred when that number is free (the
// number this node's endpoints hold for it: bound while the API server
// could not be asked, or restored, and collected meanwhile); else the
// candidates follow as for Acquire. A preferred number outside
// MinID..MaxID is refused with identity.ErrInvalidIdentity.
func (b *Backend) AcquirePreferred(ctx context.Context, ls labels.Labels, preferred identity.NumericIdentity) (identity.NumericIdentity, bool, error) {
	if preferred < b.cfg.MinID || preferred > b.cfg.MaxID || preferred.IsReserved() {
		return 0, false, fmt.Errorf("acquire identity: preferred number %d outside %d..%d: %w",
			preferred, b.cfg.MinID, b.cfg.MaxID, identity.ErrInvalidIdentity)
	}
	return b.acquirePreferring(ctx, ls, preferred)
}

func (b *Backend) acquirePreferring(ctx context.Context, ls labels.Labels, preferred identity.NumericIdentity) (identity.NumericIdentity, bool, error) {
	if len(ls) == 0 {
		return 0, false, fmt.Errorf("acquire identity: empty label set: %w", identity.ErrInvalidLabels)
	}
	if err := ls.Validate(); err != nil {
		return 0, false, fmt.Errorf("acquire identity: %w: %w", identity.ErrInvalidLabels, err)
	}
	if _, ok := identity.LookupReserved(ls); ok {
		return 0, false, fmt.Errorf("acquire identity: %s is reserved: %w", ls.Key(), identity.ErrInvalidLabels)
	}
	// Not synced yet: the probe still agrees (AlreadyExists), it only
	// costs more conflicts; wait a little for the cache.
	syncCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	cache.WaitForCacheSync(syncCtx.Done(), b.informer.HasSynced)
	cancel()
	id, isNew, err := b.acquire(ctx, ls, preferred)
	b.setHealth(err)
	if err != nil {
		return 0, false, fmt.Errorf("acquire identity for %s: %w", ls.Key(), err)
	}
	return id, isNew, nil
}

// acquire adopts the label set's object or creates one: with preferred
// first when the cache holds none for it (0: no preference), then at the
// label set's candidates.
func (b *Backend) acquire(ctx context.Context, ls labels.Labels, preferred identity.NumericIdentity) (identity.NumericIdentity, bool, error) {
	key, want := ls.Key(), toSecurityLabels(ls)
	tries := 0
	if _, held := b.cached(key); !held && preferred != identity.IdentityUnknown {
		tries++
		switch got, err := b.claim(ctx, preferred, key, want); {
		case err != nil:
			return 0, false, err
		case got == claimCreated:
			b.created.Add(1)
			return preferred, true, nil
		case got == claimAdopted:
			b.adopted.Add(1)
			return preferred, false, nil
		}
	}
	start := b.slot(key)
	span := uint64(b.cfg.MaxID-b.cfg.MinID) + 1
	for i := uint64(0); i < span && tries < b.cfg.MaxAttempts; i++ {
		if err := ctx.Err(); err != nil {
			return 0, false, err
		}
		// A label set the cache already holds is adopted, lowest number first.
		if id, ok := b.cached(key); ok {
			tries++
			switch marked, err := b.mark(ctx, id, want); {
			case err != nil:
				return 0, false, err
			case marked:
				b.adopted.Add(1)
				return id, false, nil
			}
			b.retries.Add(1)
		}
		id := b.cfg.MinID + identity.NumericIdentity((start+i)%span)
		tries++
		switch got, err := b.claim(ctx, id, key, want); {
		case err != nil:
			return 0, false, err
		case got == claimCreated:
			b.created.Add(1)
			return id, true, nil
		case got == claimAdopted:
			b.adopted.Add(1)
			return id, false, nil
		}
	}
	return 0, false, fmt.Errorf("no free identity after %d candidates: %w", tries, identity.ErrExhausted)
}

// claimResult is what claim did with a candidate.
type claimResult int

const (
	claimOther   claimResult = iota // held by other labels: next candidate
	claimCreated                    // created for these labels
	claimAdopted                    // held by these labels, marked used
)

// claim tries candidate id for the label set key: Create it, or, when it
// exists, touch it (an annotation write that changes its
// resourceVersion) and read its labels from the answer: these labels
// are adopted, others skip it. The touch is what makes the skip safe: a
// collector deletes an identity only after seeing one resourceVersion
// unused for the grace period, so the candidate stays for at least that
// long, and any agent racing for the same label set meanwhile skips it
// too and lands on the same next candidate; later ones find the label
// set in their cache.
func (b *Backend) claim(ctx context.Context, id identity.NumericIdentity, key string, want map[string]string) (claimResult, error) {
	for range 3 { // the candidate deleted (and created again) under us: retry it
		obj, cachedOther := b.get(id)
		if cachedOther {
			_, cur, ok := decode(obj)
			cachedOther = ok && cur.Key() != key
		}
		if !cachedOther {
			created, err := b.create(ctx, id, want)
			if err != nil || created {
				return claimCreated, err
			}
		}
		curKey, found, err := b.touch(ctx, id)
		switch {
		case err != nil:
			return claimOther, err
		case !found:
			continue
		case curKey != key:
			return claimOther, nil
		}
		marked, err := b.mark(ctx, id, want)
		if err != nil || marked {
			return claimAdopted, err
		}
	}
	return claimOther, nil
}

// ProbedAnnotation is the annotation a probe writes on a candidate held
// by other labels (see claim).
const ProbedAnnotation = "membrane.io/probed"

// touch writes the probe annotation on id and returns its label-set key
// from the answer; found is false when id does not exist.
func (b *Backend) touch(ctx context.Context, id identity.NumericIdentity) (string, bool, error) {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{ProbedAnnotation: now()}}})
	if err != nil {
		return "", false, fmt.Errorf("probe identity %d: %w", id, err)
	}
	u, err := b.res.Patch(ctx, strconv.Itoa(int(id)), types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("probe identity %d: %w", id, err)
	}
	mi, _ := toIdentity(u)
	if _, ls, ok := decode(mi.(*v2.MembraneIdentity)); ok {
		return ls.Key(), true, nil
	}
	return "", true, nil // malformed: not ours to adopt
}

// slot is the label set's first candidate, as an offset into the range.
func (b *Backend) slot(key string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return h.Sum64() % (uint64(b.cfg.MaxID-b.cfg.MinID) + 1)
}

// cached returns the lowest number the cache holds for key.
func (b *Backend) cached(key string) (identity.NumericIdentity, bool) {
	objs, err := b.informer.GetIndexer().ByIndex(labelsIndex, key)
	if err != nil || len(objs) == 0 {
		return 0, false
	}
	var ids []identity.NumericIdentity
	for _, o := range objs {
		if id, _, ok := decode(o.(*v2.MembraneIdentity)); ok {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return 0, false
	}
	return slices.Min(ids), true
}

// get returns the cached object of id.
func (b *Backend) get(id identity.NumericIdentity) (*v2.MembraneIdentity, bool) {
	obj, ok, err := b.informer.GetIndexer().GetByKey(strconv.Itoa(int(id)))
	if err != nil || !ok {
		return nil, false
	}
	mi, ok := obj.(*v2.MembraneIdentity)
	return mi, ok
}

// now is the time of a usage entry.
func now() string { return time.Now().UTC().Format(time.RFC3339Nano) }

// create creates identity id with the labels, this node in its usage;
// false when the name is taken.
func (b *Backend) create(ctx context.Context, id identity.NumericIdentity, want map[string]string) (bool, error) {
	mi := &v2.MembraneIdentity{TypeMeta: metav1.TypeMeta{APIVersion: v2.GroupVersion.String(), Kind: v2.IdentityKind},
		ObjectMeta: metav1.ObjectMeta{Name: strconv.Itoa(int(id))}, SecurityLabels: want, Usage: map[string]string{b.cfg.Node: now()}}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(mi)
	if err != nil {
		return false, fmt.Errorf("create identity %d: %w", id, err)
	}
	_, err = b.res.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsAlreadyExists(err):
		b.conflicts.Add(1)
		return false, nil
	}
	return false, fmt.Errorf("create identity %d: %w", id, err)
}

// mark records this node's use of id in one JSON patch that first tests
// the labels: false (no error) when id does not exist or holds other
// labels.
func (b *Backend) mark(ctx context.Context, id identity.NumericIdentity, want map[string]string) (bool, error) {
	// The CRD defaults usage to {}, so the entry's parent always exists.
	ops := []map[string]any{
		{"op": "test", "path": "/security-labels", "value": want},
		{"op": "add", "path": "/usage/" + escapePointer(b.cfg.Node), "value": now()},
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return false, fmt.Errorf("mark identity %d: %w", id, err)
	}
	_, err = b.res.Patch(ctx, strconv.Itoa(int(id)), types.JSONPatchType, patch, metav1.PatchOptions{})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	case apierrors.IsInvalid(err), apierrors.IsConflict(err), isTestFailed(err):
		return false, nil // the labels test failed: other labels
	}
	return false, fmt.Errorf("mark identity %d used by %s: %w", id, b.cfg.Node, err)
}

// isTestFailed reports a JSON patch whose test operation failed (the API
// server answers 422 or, for some versions, 500 with the message).
func isTestFailed(err error) bool {
	return strings.Contains(err.Error(), "testing value") || strings.Contains(err.Error(), "test operation")
}

// escapePointer escapes a JSON pointer token.
func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// Release implements identity.ClusterBackend: this node's entry goes.
func (b *Backend) Release(ctx context.Context, id identity.NumericIdentity) error {
	if id < b.cfg.MinID || id > b.cfg.MaxID {
		return fmt.Errorf("release identity %d: outside %d..%d: %w", id, b.cfg.MinID, b.cfg.MaxID, identity.ErrInvalidIdentity)
	}
	patch, err := json.Marshal(map[string]any{"usage": map[string]any{b.cfg.Node: nil}})
	if err != nil {
		return fmt.Errorf("release identity %d: %w", id, err)
	}
	_, err = b.res.Patch(ctx, strconv.Itoa(int(id)), types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		err = nil
	}
	b.setHealth(err)
	if err != nil {
		return fmt.Errorf("release identity %d: %w", id, err)
	}
	return nil
}

// heartbeat renews this node's lease until ctx is done.
func (b *Backend) heartbeat(ctx context.Context) {
	t := time.NewTicker(b.cfg.Heartbeat)
	defer t.Stop()
	for {
		err := b.renew(ctx)
		if ctx.Err() != nil {
			return
		}
		b.setHealth(err)
		if err != nil {
			b.log.Warn("identity heartbeat failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// leaseName is the name of node's heartbeat lease.
func leaseName(node string) string { return "membrane-identity-" + node }

// renew writes this node's lease: renewTime now, acquireTime the agent's
// start, and this node's Node as its owner (leaseOwner).
func (b *Backend) renew(ctx context.Context) error {
	leases := b.cs.CoordinationV1().Leases(b.cfg.LeaseNamespace)
	cctx, cancel := context.WithTimeout(ctx, max(b.cfg.Heartbeat, 10*time.Second))
	defer cancel()
	name, holder := leaseName(b.cfg.Node), b.cfg.Node
	secs := int32(min(b.cfg.GCGrace/time.Second, 1<<30))
	spec := coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs,
		AcquireTime: &metav1.MicroTime{Time: b.start}, RenewTime: &metav1.MicroTime{Time: time.Now()}}
	cur, err := leases.Get(cctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LeaseLabel: "true"}}, Spec: spec}
		// Read the Node again: a lease gone since the last renew may have
		// gone with a Node of this name that was deleted and registered
		// again (a new UID).
		if ref, ok := b.leaseOwner(cctx, true); ok {
			l.OwnerReferences = []metav1.OwnerReference{ref}
		}
		if _, err = leases.Create(cctx, l, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create lease %s/%s: %w", b.cfg.LeaseNamespace, name, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("get lease %s/%s: %w", b.cfg.LeaseNamespace, name, err)
	}
	cur.Spec = spec
	if !ownedByNode(cur.OwnerReferences, b.cfg.Node) {
		if ref, ok := b.leaseOwner(cctx, false); ok {
			cur.OwnerReferences = append(cur.OwnerReferences, ref)
		}
	}
	if _, err := leases.Update(cctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("renew lease %s/%s: %w", b.cfg.LeaseNamespace, name, err)
	}
	return nil
}

// leaseOwner is the owner reference of this node's lease: its Node, so
// that the Kubernetes garbage collector deletes the lease with the Node
// (an agent may write only its own lease, admission.yaml, so no agent can
// collect a gone node's). Read once, or again when fresh; false while the
// Node cannot be read (not registered yet: the next renew tries again).
func (b *Backend) leaseOwner(ctx context.Context, fresh bool) (metav1.OwnerReference, bool) {
	b.mu.Lock()
	ref := b.owner
	b.mu.Unlock()
	if ref.UID != "" && !fresh {
		return ref, true
	}
	n, err := b.cs.CoreV1().Nodes().Get(ctx, b.cfg.Node, metav1.GetOptions{})
	if err != nil {
		b.log.Debug("identity heartbeat lease without an owner: node not read", "node", b.cfg.Node, "err", err)
		return ref, false
	}
	ref = metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}
	b.mu.Lock()
	b.owner = ref
	b.mu.Unlock()
	return ref, true
}

// ownedByNode reports whether refs name node's Node.
func ownedByNode(refs []metav1.OwnerReference, node string) bool {
	for _, r := range refs {
		if r.APIVersion == "v1" && r.Kind == "Node" && r.Name == node {
			return true
		}
	}
	return false
}
