//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The NetworkPolicy conformance table of test/netpol (same cases, same
// independent model: model_test.go is a copy of test/netpol's), here
// with the policies created through the API server and enforced by the
// agents that watch it, on pods kubelet started: namespaces x, y, z with
// pods a, b, c each (labels pod=<name>), TCP and UDP servers on ports 80
// and 81, the full 9x9 matrix per port and protocol.

// step is the whole set of policies in the cluster for one check.
type step func(w *world) []*netPolicy

func policies(ps ...*netPolicy) step { return func(*world) []*netPolicy { return ps } }

// tableCase is one row of the conformance table: after each step the
// full reachability matrix of every port and protocol is checked.
type tableCase struct {
	name  string
	steps []step
}

// world is the table's pods as the model sees them, with each pod's
// network namespace for probing from it.
type world struct {
	t     *testing.T
	c     *cluster
	model []modelPod
	netns []string
	cidr  interface{ String() string }
	// applied are the policies in the cluster now, by namespace/name.
	applied map[string]bool
}

func (w *world) pod(ns, name string) modelPod {
	for _, p := range w.model {
		if p.ns == ns && p.name == name {
			return p
		}
	}
	w.t.Fatalf("no pod %s/%s", ns, name)
	return modelPod{}
}

// host32 is pod ns/name's address as a /32.
func (w *world) host32(ns, name string) string { return w.pod(ns, name).ip.String() + "/32" }

var tableCases = []tableCase{
	{"no policies: everything passes", []step{policies()}},
	{"default deny ingress in x", []step{policies(newPolicy("x", "deny-ingress", everyPod, ing))}},
	{"default deny egress in x", []step{policies(newPolicy("x", "deny-egress", everyPod, eg))}},
	{"default deny both directions in x", []step{policies(newPolicy("x", "deny-all", everyPod, ing, eg))}},
	{"allow ingress from the same namespace", []step{policies(
		newPolicy("x", "same-ns", everyPod, ing).ingress(from(npPeer{PodSelector: &labelSelector{}})))}},
	{"policyTypes defaulted: ingress rules only enforce ingress", []step{policies(
		newPolicy("x", "default-types", everyPod).ingress(from(npPeer{PodSelector: selp("pod", "b")})))}},
	{"allow ingress to x/a from namespace y (namespaceSelector on kubernetes.io/metadata.name)", []step{policies(
		newPolicy("x", "from-y", podSel("pod", "a"), ing).ingress(from(npPeer{NamespaceSelector: nsName("y")})))}},
	{"allow ingress to x/a from namespaces other than x (NotIn)", []step{policies(
		newPolicy("x", "not-x", podSel("pod", "a"), ing).ingress(from(npPeer{NamespaceSelector: &labelSelector{
			MatchExpressions: []labelExpr{{Key: "kubernetes.io/metadata.name", Operator: "NotIn", Values: []string{"x"}}}}})))}},
	{"podSelector AND namespaceSelector in one peer", []step{policies(
		newPolicy("x", "b-in-y", podSel("pod", "a"), ing).ingress(from(npPeer{NamespaceSelector: nsName("y"), PodSelector: selp("pod", "b")})))}},
	{"podSelector OR namespaceSelector as two peers", []step{policies(
		newPolicy("x", "y-or-b", podSel("pod", "a"), ing).ingress(from(npPeer{NamespaceSelector: nsName("y")}, npPeer{PodSelector: selp("pod", "b")})))}},
	{"any namespace's pods c (empty namespaceSelector)", []step{policies(
		newPolicy("x", "any-c", podSel("pod", "a"), ing).ingress(from(npPeer{NamespaceSelector: &labelSelector{}, PodSelector: selp("pod", "c")})))}},
	{"ingress on TCP 81 only, from anywhere", []step{policies(
		newPolicy("x", "port-81", podSel("pod", "a"), ing).ingress(npRule{}.on(tcp(81))))}},
	{"port range with endPort and a UDP port, from namespace z", []step{policies(
		newPolicy("x", "range", podSel("pod", "a"), ing).ingress(from(npPeer{NamespaceSelector: nsName("z")}).on(
			npPort{Protocol: "TCP", Port: intp(80), EndPort: intp(81)}, npPort{Protocol: "UDP", Port: intp(81)})))}},
	{"UDP on every port only", []step{policies(
		newPolicy("x", "udp", everyPod, ing).ingress(npRule{}.on(npPort{Protocol: "UDP"})))}},
	{"egress to namespace y on TCP 80 only", []step{policies(
		newPolicy("x", "egress-y-80", everyPod, eg).egress(to(npPeer{NamespaceSelector: nsName("y")}).on(tcp(80))))}},
	{"ipBlock: a pod's /32 admits that pod and no other", []step{func(w *world) []*netPolicy {
		return []*netPolicy{newPolicy("x", "pod-32", podSel("pod", "a"), ing).ingress(from(block(w.host32("y", "b"))))}
	}}},
	{"ipBlock except carves out pods", []step{func(w *world) []*netPolicy {
		return []*netPolicy{newPolicy("x", "except", podSel("pod", "a"), ing).ingress(
			from(block(w.cidr.String(), w.host32("y", "b"), w.host32("z", "c"))))}
	}}},
	{"egress to 0.0.0.0/0 allows every pod", []step{policies(
		newPolicy("x", "egress-all", everyPod, eg).egress(to(block("0.0.0.0/0"))))}},
	{"egress to 0.0.0.0/0 except a pod", []step{func(w *world) []*netPolicy {
		return []*netPolicy{newPolicy("x", "egress-except", everyPod, eg).egress(to(block("0.0.0.0/0", w.host32("y", "a"))))}
	}}},
	{"an except is not undone by another policy's broader ipBlock on another port", []step{func(w *world) []*netPolicy {
		return []*netPolicy{
			newPolicy("x", "except-80", podSel("pod", "a"), ing).ingress(from(block(w.cidr.String(), w.host32("y", "b"))).on(tcp(80))),
			newPolicy("x", "all-81", podSel("pod", "a"), ing).ingress(from(block("0.0.0.0/0")).on(tcp(81))),
		}
	}}},
	{"a selector of another policy allows an excepted pod", []step{func(w *world) []*netPolicy {
		return []*netPolicy{
			newPolicy("x", "except-yb", podSel("pod", "a"), ing).ingress(from(block(w.cidr.String(), w.host32("y", "b")))),
			newPolicy("x", "yb", podSel("pod", "a"), ing).ingress(from(npPeer{NamespaceSelector: nsName("y"), PodSelector: selp("pod", "b")}).on(tcp(81))),
		}
	}}},
	{"multiple policies are OR'd", []step{policies(
		newPolicy("x", "y-on-80", podSel("pod", "a"), ing).ingress(from(npPeer{NamespaceSelector: nsName("y")}).on(tcp(80))),
		newPolicy("x", "z-on-81", podSel("pod", "a"), ing).ingress(from(npPeer{NamespaceSelector: nsName("z")}).on(tcp(81))))}},
	{"egress of x and ingress of y both apply", []step{policies(
		newPolicy("x", "egress-to-y", everyPod, eg).egress(to(npPeer{NamespaceSelector: nsName("y")})),
		newPolicy("y", "ingress-from-a", everyPod, ing).ingress(from(npPeer{NamespaceSelector: &labelSelector{}, PodSelector: selp("pod", "a")})))}},
	{"policy update, then deletion", []step{
		policies(newPolicy("x", "changing", podSel("pod", "a"), ing).ingress(from(npPeer{NamespaceSelector: nsName("y")}))),
		policies(newPolicy("x", "changing", podSel("pod", "a"), ing).ingress(from(npPeer{NamespaceSelector: nsName("z")}).on(tcp(81)))),
		policies(),
	}},
}

// newWorld creates namespaces x, y, z and pods a, b, c in each, on
// node. All nine are on one node until cross-node pod traffic is on main.
func newWorld(t *testing.T, c *cluster, n *node) *world {
	w := &world{t: t, c: c, cidr: n.cidr, applied: map[string]bool{}}
	var specs []podLike
	for _, ns := range []string{"x", "y", "z"} {
		c.namespace(t, ns, nil)
		for _, name := range []string{"a", "b", "c"} {
			specs = append(specs, podSpec(ns, name, n.name, map[string]string{"pod": name}))
		}
	}
	pods := c.createPods(t, specs...)
	for _, s := range specs {
		p := pods[s.Namespace+"/"+s.Name]
		w.model = append(w.model, modelPod{ns: p.Namespace, name: p.Name, labels: p.Labels, ip: podIP(t, p)})
		w.netns = append(w.netns, mustNetns(t, p))
	}
	t.Cleanup(func() { w.t = t; w.apply(nil) })
	return w
}

// apply makes pols the cluster's whole set of NetworkPolicies in x, y, z:
// creates or updates each through the API, deletes the others.
func (w *world) apply(pols []*netPolicy) {
	w.t.Helper()
	ctx := context.Background()
	want := map[string]bool{}
	for _, p := range pols {
		raw, err := json.Marshal(p)
		if err != nil {
			w.t.Fatal(err)
		}
		var np networkingv1.NetworkPolicy
		if err := json.Unmarshal(raw, &np); err != nil {
			w.t.Fatalf("policy %s as networking/v1: %v", p.Metadata.Name, err)
		}
		api := w.c.client.NetworkingV1().NetworkPolicies(np.Namespace)
		cur, err := api.Get(ctx, np.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = api.Create(ctx, &np, metav1.CreateOptions{})
		case err == nil:
			np.ResourceVersion = cur.ResourceVersion
			_, err = api.Update(ctx, &np, metav1.UpdateOptions{})
		}
		if err != nil {
			w.t.Fatalf("apply policy %s/%s: %v", np.Namespace, np.Name, err)
		}
		want[np.Namespace+"/"+np.Name] = true
	}
	for key := range w.applied {
		if want[key] {
			continue
		}
		ns, name, _ := strings.Cut(key, "/")
		if err := w.c.client.NetworkingV1().NetworkPolicies(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			w.t.Fatalf("delete policy %s: %v", key, err)
		}
	}
	w.applied = want
}

// observe probes every pair for k, 32 probes at a time.
func (w *world) observe(k probeKey) matrix {
	m := newMatrix(len(w.model))
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i := range w.model {
		for j, dst := range w.model {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				who, err := dial(w.netns[i], dst.ip, k.port, strings.ToLower(k.proto), 2*time.Second)
				m[i][j] = err == nil && who == dst.String()
			}()
		}
	}
	wg.Wait()
	return m
}

// check applies pols and compares every matrix with the model's until
// they agree (the agents realise a policy asynchronously after the API
// server has it) or a minute has passed; then it reports the last
// disagreement as upstream prints it.
func (w *world) check(pols []*netPolicy) string {
	w.t.Helper()
	w.apply(pols)
	var report string
	deadline := time.Now().Add(time.Minute)
	for {
		var b strings.Builder
		for _, k := range probeKeys {
			want := expected(pols, w.model, k)
			if got := w.observe(k); !got.equal(want) {
				b.WriteString(diffReport(w.model, k, want, got))
			}
		}
		if report = b.String(); report == "" || time.Now().After(deadline) {
			return report
		}
		time.Sleep(time.Second)
	}
}

// TestNetworkPolicyConformance runs the table: per case and step, the
// policies go in through the API server (the others are deleted), and
// the observed matrices of TCP and UDP on ports 80 and 81 must equal the
// model's.
func TestNetworkPolicyConformance(t *testing.T) {
	c := requireCluster(t)
	w := newWorld(t, c, c.nodes[0])
	start := time.Now()
	for _, tc := range tableCases {
		t.Run(tc.name, func(t *testing.T) {
			w.t = t
			for i, st := range tc.steps {
				pols := st(w)
				if report := w.check(pols); report != "" {
					t.Errorf("step %d of %d:\n%s", i+1, len(tc.steps), report)
				}
			}
		})
	}
	t.Logf("%d cases in %v", len(tableCases), time.Since(start).Round(time.Second))
}
