package netpol

import (
	"strings"
	"testing"
	"time"
)

// step is the whole set of policies the agent holds for one check.
type step func(w *world) []*netPolicy

func policies(ps ...*netPolicy) step { return func(*world) []*netPolicy { return ps } }

// tableCase is one row of the conformance table: after each step the
// full reachability matrix of every port and protocol is checked.
type tableCase struct {
	name  string
	steps []step
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

// TestNetworkPolicyConformance runs the table on one world: per case and
// step, the policies go in through PUT /v1/policy (the others are
// deleted), the agent realises them, and the observed matrices of TCP
// and UDP on ports 80 and 81 must equal the model's.
func TestNetworkPolicyConformance(t *testing.T) {
	w := newWorld(t, "10.232.0.0/24")
	start := time.Now()
	for _, tc := range tableCases {
		t.Run(tc.name, func(t *testing.T) {
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

// check applies pols and compares every matrix with the model's. A
// mismatch is looked at again twice (after the agent settles again), as
// upstream retries probes, before it is reported.
func (w *world) check(pols []*netPolicy) string {
	w.t.Helper()
	w.apply(pols)
	var report string
	for attempt := range 3 {
		if attempt > 0 {
			time.Sleep(500 * time.Millisecond)
		}
		w.settle()
		var b strings.Builder
		for _, k := range probeKeys {
			want := expected(pols, w.model, k)
			if got := w.observe(k, want); !got.equal(want) {
				b.WriteString(diffReport(w.model, k, want, got))
			}
		}
		if report = b.String(); report == "" {
			return ""
		}
	}
	return report
}
