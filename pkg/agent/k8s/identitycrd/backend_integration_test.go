package identitycrd_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
	"github.com/membrane-cni/membrane/pkg/agent/k8s/identitycrd"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// One real etcd + kube-apiserver for the package.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(raceChild())
	}
	os.Exit(kubetest.Main(m))
}

func acquire(tb testing.TB, b *identitycrd.Backend, ss ...string) (identity.NumericIdentity, bool) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	id, isNew, err := b.Acquire(ctx, mustLabels(tb, ss...))
	if err != nil {
		tb.Fatal(err)
	}
	return id, isNew
}

// noGC is a config without this backend's collector.
func noGC(node string) identitycrd.Config {
	return identitycrd.Config{Node: node, GCInterval: -1}
}

// TestCreateAndReuse: the first Acquire creates the object (name = the
// number, the labels as security-labels, the node in usage); the same
// node and another node get the same number; Release removes only the
// releasing node's entry.
func TestCreateAndReuse(t *testing.T) {
	e := env(t)
	na, nb := uniq("node-a"), uniq("node-b")
	a, b := newBackend(t, e.Config, noGC(na)), newBackend(t, e.Config, noGC(nb))
	app := uniq("web")
	id, isNew := acquire(t, a, "k8s:app="+app, "k8s:io.kubernetes.pod.namespace=default")
	if !isNew || id < identity.MinLocalIdentity {
		t.Fatalf("first acquire: %d new=%v", id, isNew)
	}
	if again, isNew := acquire(t, a, "k8s:app="+app, "k8s:io.kubernetes.pod.namespace=default"); again != id || isNew {
		t.Fatalf("second acquire on the same node: %d new=%v, want %d old", again, isNew, id)
	}
	if other, isNew := acquire(t, b, "k8s:io.kubernetes.pod.namespace=default", "k8s:app="+app); other != id || isNew {
		t.Fatalf("acquire on another node: %d new=%v, want %d old", other, isNew, id)
	}
	mi := getIdentity(t, e.Config, id)
	if mi == nil || mi.SecurityLabels["k8s:app"] != app || mi.SecurityLabels["k8s:io.kubernetes.pod.namespace"] != "default" || len(mi.SecurityLabels) != 2 {
		t.Fatalf("object %d: %+v", id, mi)
	}
	if _, ok := mi.Usage[na]; !ok {
		t.Fatalf("usage %v lacks %s", mi.Usage, na)
	}
	if _, ok := mi.Usage[nb]; !ok {
		t.Fatalf("usage %v lacks %s", mi.Usage, nb)
	}
	if err := a.Release(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	mi = getIdentity(t, e.Config, id)
	if _, ok := mi.Usage[na]; ok || mi.Usage[nb] == "" {
		t.Fatalf("after %s released: usage %v", na, mi.Usage)
	}
	if _, _, err := a.Acquire(context.Background(), mustLabels(t, "reserved:host")); err == nil {
		t.Fatal("a reserved label set reached the backend")
	}
}

// TestConflictMovesToNextCandidate: when a label set's first candidate
// holds other labels (created behind the backend's back, so its cache
// may not know yet), Create conflicts and the next candidate is used;
// a second node then adopts that one.
func TestConflictMovesToNextCandidate(t *testing.T) {
	e := env(t)
	a := newBackend(t, e.Config, noGC(uniq("node-c")))
	ls := mustLabels(t, "k8s:app="+uniq("conflict"))
	slot := a.SlotForTest(ls)
	squat := uniq("squatter")
	createRaw(t, e.Config, slot, map[string]string{"k8s:app": squat})
	before := a.Stats().Conflicts
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	id, isNew, err := a.Acquire(ctx, ls)
	if err != nil {
		t.Fatal(err)
	}
	if id == slot || !isNew {
		t.Fatalf("acquire: %d new=%v; the first candidate %d holds other labels", id, isNew, slot)
	}
	if got := getIdentity(t, e.Config, slot); got == nil || got.SecurityLabels["k8s:app"] != squat || got.Annotations[identitycrd.ProbedAnnotation] == "" {
		t.Fatalf("the squatter's object: %+v, want its labels, touched by the probe", got)
	}
	if a.Stats().Conflicts == before {
		// The cache may have listed the squatter already and skipped it
		// without a conflict; both are right, but then the object was
		// never contested: say so.
		t.Logf("candidate %d skipped from the cache", slot)
	}
	b := newBackend(t, e.Config, noGC(uniq("node-d")))
	if other, isNew := acquire(t, b, ls.Strings()...); other != id || isNew {
		t.Fatalf("second node: %d new=%v, want %d", other, isNew, id)
	}
}

// createRaw creates identity id with labels and no usage.
func createRaw(tb testing.TB, rc *rest.Config, id identity.NumericIdentity, sl map[string]string) {
	tb.Helper()
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		tb.Fatal(err)
	}
	mi := &v2.MembraneIdentity{TypeMeta: metav1.TypeMeta{APIVersion: v2.GroupVersion.String(), Kind: v2.IdentityKind},
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint(id)}, SecurityLabels: sl}
	obj, err := kruntime.DefaultUnstructuredConverter.ToUnstructured(mi)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := dyn.Resource(v2.IdentityResource).Create(context.Background(), &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
}

// TestCRDRejectsBadObjects: the API server validates the manifest's
// schema: a name that is not a number and changed labels are refused.
func TestCRDRejectsBadObjects(t *testing.T) {
	e := env(t)
	dyn, err := dynamic.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	res := dyn.Resource(v2.IdentityResource)
	bad := &unstructured.Unstructured{Object: map[string]any{"apiVersion": v2.GroupVersion.String(), "kind": v2.IdentityKind,
		"metadata": map[string]any{"name": "web"}, "security-labels": map[string]any{"k8s:app": "x"}}}
	if _, err := res.Create(context.Background(), bad, metav1.CreateOptions{}); err == nil {
		t.Fatal("an identity named \"web\" was accepted")
	}
	a := newBackend(t, e.Config, noGC(uniq("node-e")))
	id, _ := acquire(t, a, "k8s:app="+uniq("immutable"))
	u, err := res.Get(context.Background(), fmt.Sprint(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(u.Object, "changed", "security-labels", "k8s:app"); err != nil {
		t.Fatal(err)
	}
	if _, err := res.Update(context.Background(), u, metav1.UpdateOptions{}); err == nil {
		t.Fatal("changing an identity's labels was accepted")
	}
}

// TestGCGraceAndInUse: an identity no node uses is deleted only after it
// was seen unused, unchanged, for the grace period; an identity a live
// node uses is never deleted.
func TestGCGraceAndInUse(t *testing.T) {
	e := env(t)
	cfg := noGC(uniq("node-gc"))
	cfg.GCGrace, cfg.Heartbeat = 2*time.Second, 200*time.Millisecond
	a := newBackend(t, e.Config, cfg)
	used, _ := acquire(t, a, "k8s:app="+uniq("used"))
	unused, _ := acquire(t, a, "k8s:app="+uniq("unused"))
	if err := a.Release(context.Background(), unused); err != nil {
		t.Fatal(err)
	}
	waitForRelease(t, a, unused, cfg.Node)
	marks := identitycrd.NewMarks()
	ctx := context.Background()
	if err := a.CollectOnce(ctx, marks); err != nil { // marks it unused
		t.Fatal(err)
	}
	if getIdentity(t, e.Config, unused) == nil {
		t.Fatal("an unused identity was deleted by the pass that first saw it unused")
	}
	for id, want := range map[identity.NumericIdentity]identitycrd.Decision{used: identitycrd.DecisionInUse, unused: identitycrd.DecisionUnused} {
		v, ok := marks.Verdict(fmt.Sprint(id))
		if !ok || v.Decision != want || (want == identitycrd.DecisionInUse && (v.Node != cfg.Node || !strings.Contains(v.Why, "lease is fresh"))) {
			t.Fatalf("verdict on %d: %+v (%v), want decision %d", id, v, ok, want)
		}
		t.Logf("verdict on %d: %s", id, v)
	}
	testutil.Eventually(t, "the unused identity collected", func() bool {
		if err := a.CollectOnce(ctx, marks); err != nil {
			t.Fatal(err)
		}
		return getIdentity(t, e.Config, unused) == nil
	})
	if v, _ := marks.Verdict(fmt.Sprint(unused)); v.Decision != identitycrd.DecisionDeleted && v.Decision != identitycrd.DecisionGone {
		t.Fatalf("verdict on the collected %d: %s", unused, v)
	}
	if getIdentity(t, e.Config, used) == nil {
		t.Fatal("GC deleted an identity in use")
	}
}

// TestGCLosesToConcurrentAcquire: an identity seen unused for longer than
// the grace period is marked used again just before the pass that would
// delete it: the pass's delete carries the old resourceVersion and
// fails, and the identity stays with the node's entry.
func TestGCLosesToConcurrentAcquire(t *testing.T) {
	e := env(t)
	cfg := noGC(uniq("node-race"))
	cfg.GCGrace, cfg.Heartbeat = time.Second, 100*time.Millisecond
	a := newBackend(t, e.Config, cfg)
	ls := "k8s:app=" + uniq("revived")
	id, _ := acquire(t, a, ls)
	if err := a.Release(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	waitForRelease(t, a, id, cfg.Node)
	marks := identitycrd.NewMarks()
	ctx := context.Background()
	if err := a.CollectOnce(ctx, marks); err != nil { // marks it unused
		t.Fatal(err)
	}
	time.Sleep(cfg.GCGrace + 100*time.Millisecond) // past the grace of any mark made above
	if again, _ := acquire(t, a, ls); again != id {
		t.Fatalf("re-acquire: %d, want %d", again, id)
	}
	// The pass may still see the old version in its cache (the delete is
	// refused) or the new one (in use): either way the identity stays.
	if err := a.CollectOnce(ctx, marks); err != nil {
		t.Fatal(err)
	}
	mi := getIdentity(t, e.Config, id)
	if mi == nil {
		t.Fatal("GC deleted an identity acquired again")
	}
	if v, _ := marks.Verdict(fmt.Sprint(id)); v.Decision != identitycrd.DecisionRefused && v.Decision != identitycrd.DecisionInUse {
		t.Fatalf("verdict on %d acquired again: %s, want refused or in use", id, v)
	}
	if _, ok := mi.Usage[cfg.Node]; !ok {
		t.Fatalf("usage %v lacks %s", mi.Usage, cfg.Node)
	}
}

// TestWatch: Watch reports the existing identities, then Synced, then new
// and deleted ones.
func TestWatch(t *testing.T) {
	e := env(t)
	cfg := noGC(uniq("node-w"))
	cfg.GCGrace, cfg.Heartbeat = time.Second, 100*time.Millisecond
	a := newBackend(t, e.Config, cfg)
	before, _ := acquire(t, a, "k8s:app="+uniq("before"))
	// Watch lists what the backend's informer holds; Acquire answers
	// after the Create, which the informer may not have seen yet.
	testutil.Eventually(t, "the informer holds the existing identity", func() bool {
		_, ok := a.CachedUsageForTest(before)
		return ok
	})
	var mu sync.Mutex
	var evs []identity.ClusterEvent
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- a.Watch(ctx, func(ev identity.ClusterEvent) {
			mu.Lock()
			evs = append(evs, ev)
			mu.Unlock()
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	seen := func(kind identity.ClusterEventKind, id identity.NumericIdentity) int {
		mu.Lock()
		defer mu.Unlock()
		for i, ev := range evs {
			if ev.Kind == kind && ev.ID == id {
				return i
			}
		}
		return -1
	}
	testutil.Eventually(t, "synced", func() bool { return seen(identity.ClusterSynced, 0) >= 0 })
	if i := seen(identity.ClusterUpsert, before); i < 0 || i > seen(identity.ClusterSynced, 0) {
		t.Fatalf("the existing identity %d was not reported before Synced: %v", before, evs)
	}
	newLabels := "k8s:app=" + uniq("after")
	after, _ := acquire(t, a, newLabels)
	testutil.Eventually(t, "the new identity reported", func() bool { return seen(identity.ClusterUpsert, after) >= 0 })
	i := seen(identity.ClusterUpsert, after)
	mu.Lock()
	ev := evs[i]
	mu.Unlock()
	if ev.Labels.Key() != mustLabels(t, newLabels).Key() {
		t.Fatalf("upsert labels %s, want %s", ev.Labels.Key(), newLabels)
	}
	if err := a.Release(context.Background(), after); err != nil {
		t.Fatal(err)
	}
	marks := identitycrd.NewMarks()
	testutil.Eventually(t, "the released identity collected and reported", func() bool {
		if err := a.CollectOnce(context.Background(), marks); err != nil {
			t.Fatal(err)
		}
		return seen(identity.ClusterDelete, after) >= 0
	})
	st := a.Status()
	if !st.Healthy || !st.Synced || st.Backend != "kubernetes" {
		t.Fatalf("status %+v", st)
	}
}

// waitForRelease waits until b's cache shows id without node's entry.
func waitForRelease(tb testing.TB, b *identitycrd.Backend, id identity.NumericIdentity, node string) {
	tb.Helper()
	testutil.Eventually(tb, "the release in the cache", func() bool {
		usage, ok := b.CachedUsageForTest(id)
		_, used := usage[node]
		return ok && !used
	})
}

// TestGCNodeGoneAndRestarted: a node's entries stop counting when its
// heartbeat stops (the node is gone) and when its agent restarted
// (entries older than the new agent's start): a restarted agent keeps
// only what it acquires again.
func TestGCNodeGoneAndRestarted(t *testing.T) {
	e := env(t)
	grace := time.Second
	cfg := func(node string) identitycrd.Config {
		c := noGC(node)
		c.GCGrace, c.Heartbeat = grace, 100*time.Millisecond
		return c
	}
	gone, restarted := uniq("node-gone"), uniq("node-restarted")
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	g, err := identitycrd.New(e.Config, cfg(gone), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	goneID, _ := acquire(t, g, "k8s:app="+uniq("gone"))
	if err := g.Close(); err != nil { // the node goes: no release, no heartbeat
		t.Fatal(err)
	}
	r1, err := identitycrd.New(e.Config, cfg(restarted), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	dropped, _ := acquire(t, r1, "k8s:app="+uniq("dropped"))
	keptLabels := "k8s:app=" + uniq("kept")
	kept, _ := acquire(t, r1, keptLabels)
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}
	r2 := newBackend(t, e.Config, cfg(restarted)) // the same node's next agent
	if again, _ := acquire(t, r2, keptLabels); again != kept {
		t.Fatalf("the restarted agent got %d for its label set, want %d", again, kept)
	}
	collector := newBackend(t, e.Config, cfg(uniq("node-collector")))
	marks := identitycrd.NewMarks()
	testutil.Eventually(t, "the gone node's and the previous agent's identities collected", func() bool {
		if err := collector.CollectOnce(ctx, marks); err != nil {
			t.Fatal(err)
		}
		return getIdentity(t, e.Config, goneID) == nil && getIdentity(t, e.Config, dropped) == nil
	})
	if mi := getIdentity(t, e.Config, kept); mi == nil || mi.Usage[restarted] == "" {
		t.Fatalf("the identity the restarted agent acquired again: %+v", mi)
	}
}

// TestLeaseOwnedByNode: a node's heartbeat lease names the node's Node as
// its owner, so that the Kubernetes garbage collector deletes it with the
// Node (no agent may delete another node's lease); a lease written before
// its Node was registered gets the owner once the Node can be read.
func TestLeaseOwnedByNode(t *testing.T) {
	e := env(t)
	cs := kubernetes.NewForConfigOrDie(e.Config)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	node := uniq("node-owner")
	c := noGC(node)
	c.Heartbeat = 100 * time.Millisecond
	newBackend(t, e.Config, c)
	lease := func() *coordinationv1.Lease {
		l, err := cs.CoordinationV1().Leases("kube-system").Get(ctx, "membrane-identity-"+node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	testutil.Eventually(t, "the lease written", func() bool { return lease() != nil })
	if refs := lease().OwnerReferences; len(refs) != 0 {
		t.Fatalf("lease owned before its Node exists: %+v", refs)
	}
	n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	testutil.Eventually(t, "the lease owned by its Node", func() bool {
		refs := lease().OwnerReferences
		return len(refs) == 1 && refs[0].Kind == "Node" && refs[0].APIVersion == "v1" && refs[0].Name == node && refs[0].UID == n.UID
	})
	// A lease gone (the garbage collector, with a Node deleted and
	// registered again) is written again owned by the Node's new UID.
	if err := cs.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	n2, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.CoordinationV1().Leases("kube-system").Delete(ctx, "membrane-identity-"+node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the lease written again, owned by the new Node", func() bool {
		l := lease()
		return l != nil && len(l.OwnerReferences) == 1 && l.OwnerReferences[0].UID == n2.UID
	})
}
