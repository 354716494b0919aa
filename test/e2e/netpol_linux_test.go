//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/test/netpolmodel"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The NetworkPolicy conformance table of test/netpol (the same cases and
// independent model, from test/netpolmodel), here
// with the policies created through the API server and enforced by the
// agents that watch it, on pods kubelet started: namespaces x, y, z with
// pods a, b, c each (labels pod=<name>), TCP and UDP servers on ports 80
// and 81, the full 9x9 matrix per port and protocol.

// world is the table's pods as the model sees them, with each pod's
// network namespace for probing from it.
type world struct {
	t     *testing.T
	c     *cluster
	model []netpolmodel.Pod
	netns []string
	cidr  interface{ String() string }
	// applied are the policies in the cluster now, by namespace/name.
	applied map[string]bool
}

func (w *world) pod(ns, name string) netpolmodel.Pod {
	for _, p := range w.model {
		if p.NS == ns && p.Name == name {
			return p
		}
	}
	w.t.Fatalf("no pod %s/%s", ns, name)
	return netpolmodel.Pod{}
}

// Host32 is pod ns/name's address as a /32.
func (w *world) Host32(ns, name string) string { return w.pod(ns, name).IP.String() + "/32" }

// CIDR is the pods' range.
func (w *world) CIDR() string { return w.cidr.String() }

// newWorld creates namespaces x, y, z and pods a, b, c in each, placed by
// the scheduler (with several nodes, policy across nodes too); CIDR is the
// cluster's pod range.
func newWorld(t *testing.T, c *cluster) *world {
	w := &world{t: t, c: c, cidr: clusterCIDR, applied: map[string]bool{}}
	var specs []podLike
	for _, ns := range []string{"x", "y", "z"} {
		c.namespace(t, ns, nil)
		for _, name := range []string{"a", "b", "c"} {
			specs = append(specs, podSpec(ns, name, "", map[string]string{"pod": name}))
		}
	}
	pods := c.createPods(t, specs...)
	for _, s := range specs {
		p := pods[s.Namespace+"/"+s.Name]
		w.model = append(w.model, netpolmodel.Pod{NS: p.Namespace, Name: p.Name, Labels: p.Labels, IP: podIP(t, p)})
		w.netns = append(w.netns, mustNetns(t, p))
	}
	t.Cleanup(func() { w.t = t; w.apply(nil) })
	return w
}

// apply makes pols the cluster's whole set of NetworkPolicies in x, y, z:
// creates or updates each through the API, deletes the others.
func (w *world) apply(pols []*netpolmodel.Policy) {
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
func (w *world) observe(k netpolmodel.ProbeKey) netpolmodel.Matrix {
	m := netpolmodel.NewMatrix(len(w.model))
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i := range w.model {
		for j, dst := range w.model {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				who, err := dial(w.netns[i], dst.IP, k.Port, strings.ToLower(k.Proto), 2*time.Second)
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
func (w *world) check(pols []*netpolmodel.Policy) string {
	w.t.Helper()
	w.apply(pols)
	var report string
	deadline := time.Now().Add(time.Minute)
	for {
		var b strings.Builder
		for _, k := range netpolmodel.ProbeKeys {
			want := netpolmodel.Expected(pols, w.model, k)
			if got := w.observe(k); !got.Equal(want) {
				b.WriteString(netpolmodel.DiffReport(w.model, k, want, got))
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
	w := newWorld(t, c)
	start := time.Now()
	for _, tc := range netpolmodel.Cases {
		t.Run(tc.Name, func(t *testing.T) {
			w.t = t
			for i, st := range tc.Steps {
				pols := st(w)
				if report := w.check(pols); report != "" {
					t.Errorf("step %d of %d:\n%s", i+1, len(tc.Steps), report)
				}
			}
		})
	}
	t.Logf("%d cases in %v", len(netpolmodel.Cases), time.Since(start).Round(time.Second))
}
