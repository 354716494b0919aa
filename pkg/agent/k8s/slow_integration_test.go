package k8s_test

import (
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// TestSlowAPIServer puts a proxy adding slowDelay each way between the
// agent and its kube-apiserver (issue 38's slow control plane), makes
// changes while it is slow, cuts every connection so the informers
// relist through the delay, and checks: a CNI ADD still completes, the
// status says the API server is not answering in time, the agent's
// goroutines and heap stay bounded and flat, the relists complete and
// the writes land while it is still slow (each write is bounded by
// applyTimeout and retried, not lost), and once the delay is gone the
// agent is connected and synced with every change applied.
func TestSlowAPIServer(t *testing.T) {
	const slowDelay = 2 * time.Second
	env := kubetest.Require(t)
	u, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := testutil.NewDelayProxy(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	k := startAgent(t, nodeName, func(c *agent.Config) {
		rc := rest.CopyConfig(env.Config)
		rc.Host = "https://" + proxy.Addr()
		c.K8s.Kubeconfig, c.K8s.REST = "", rc
		c.K8s.ProbeInterval = 500 * time.Millisecond
	})
	ns := fmt.Sprintf("slow-%d", time.Now().UnixNano()%1_000_000)
	k.namespace(t, ns, nil)
	k.podOn(t, nodeName, ns, "web", map[string]string{"app": "web"})
	k.podOn(t, nodeName, ns, "client", map[string]string{"app": "client"})
	web, cl := k.addressedEndpoint(t, ns, "web"), k.addressedEndpoint(t, ns, "client")
	if _, err := k.cs.NetworkingV1().NetworkPolicies(ns).Create(k.ctx,
		ingressNP(ns, "web-from-client", map[string]string{"app": "web"}, map[string]string{"app": "client"}, 80), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.eventually(t, "policy realised before the delay", func() (bool, string) {
		_, r, enf := k.ingressFrom(t, web.ID, 80)
		return enf && slices.Equal(r, []uint32{uint32(cl.Identity.ID)}), fmt.Sprint(r, enf)
	})
	k.eventually(t, "endpoint objects written before the delay", func() (bool, string) {
		_, a := mepStatus(t, k.ctx, k.dyn, ns, "web")
		_, b := mepStatus(t, k.ctx, k.dyn, ns, "client")
		return a != nil && b != nil, fmt.Sprint(a, b)
	})
	g0, h0 := testutil.GoroutinesAndHeap()

	proxy.SetDelay(slowDelay)
	t.Logf("API server %s away each way; baseline %d goroutines, %d MiB heap", slowDelay, g0, h0>>20)
	k.relabelPod(t, ns, "client", map[string]string{"app": "client", "ver": "2"})
	if _, err := k.cs.NetworkingV1().NetworkPolicies(ns).Create(k.ctx,
		ingressNP(ns, "web-from-client-9090", map[string]string{"app": "web"}, map[string]string{"app": "client"}, 9090), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.podOn(t, nodeName, ns, "late", map[string]string{"app": "late"})
	late := k.addressedEndpoint(t, ns, "late") // a CNI ADD while slow: waits for the pod at most PodWait, never for the writes
	proxy.CutAll()                             // watches and writes reconnect and relist through the delay

	k.eventually(t, "status says the API server does not answer in time", func() (bool, string) {
		st := k.k8sStatus(t)
		return st.Connection == "disconnected" && st.LastError != "", fmt.Sprintf("%+v", st)
	})
	var samples []int
	var heaps []uint64
	for range 12 {
		time.Sleep(time.Second)
		g, h := testutil.GoroutinesAndHeap()
		samples, heaps = append(samples, g), append(heaps, h)
	}
	t.Logf("while slow: goroutines %v, heap MiB %v, proxy connections %d open / %d accepted", samples, testutil.MiB(heaps), proxy.Open(), proxy.Accepted.Load())
	if peak := slices.Max(samples); peak > g0+400 {
		t.Errorf("goroutines while slow: peak %d, baseline %d: unbounded", peak, g0)
	}
	if first, last := testutil.Mean(samples[:4]), testutil.Mean(samples[8:]); last > first+50 {
		t.Errorf("goroutines grow while slow: %.0f -> %.0f", first, last)
	}
	if peak := slices.Max(heaps); peak > h0+128<<20 {
		t.Errorf("heap while slow: peak %d MiB, baseline %d MiB", peak>>20, h0>>20)
	}

	// Still slow: the relists complete and the writes land, late.
	k.eventually(t, "while slow, the relist brings the relabel and the new policy", func() (bool, string) {
		c := k.get(t, cl.ID)
		if !hasAll(c.Labels, "k8s:ver=2") || !identityResolved(c) {
			return false, fmt.Sprint(c.Labels)
		}
		_, r9090, _ := k.ingressFrom(t, web.ID, 9090)
		return slices.Equal(r9090, []uint32{uint32(c.Identity.ID)}), fmt.Sprint(r9090)
	})
	k.eventually(t, "while slow, the new endpoint's object is written", func() (bool, string) {
		_, st := mepStatus(t, k.ctx, k.dyn, ns, "late")
		return st != nil, "no object"
	})

	proxy.SetDelay(0)
	k.eventually(t, "connected and synced again", func() (bool, string) {
		st := k.k8sStatus(t)
		return st.Connection == "connected" && st.State == "synced", fmt.Sprintf("%+v", st)
	})
	k.eventually(t, "every change made while slow applied", func() (bool, string) {
		c, l := k.get(t, cl.ID), k.get(t, late.ID)
		if !hasAll(c.Labels, "k8s:ver=2") || !identityResolved(c) || !hasAll(l.Labels, "k8s:app=late") || !identityResolved(l) {
			return false, fmt.Sprint(c.Labels, l.Labels)
		}
		_, r80, _ := k.ingressFrom(t, web.ID, 80)
		_, r9090, _ := k.ingressFrom(t, web.ID, 9090)
		want := []uint32{uint32(c.Identity.ID)}
		return slices.Equal(r80, want) && slices.Equal(r9090, want), fmt.Sprintf("80 %v 9090 %v want %v", r80, r9090, want)
	})
	k.eventually(t, "the endpoint objects written", func() (bool, string) {
		_, st := mepStatus(t, k.ctx, k.dyn, ns, "late")
		_, cs := mepStatus(t, k.ctx, k.dyn, ns, "client")
		c := k.get(t, cl.ID)
		return st != nil && cs != nil && cs.Identity != nil && cs.Identity.ID == c.Identity.ID, fmt.Sprint(st, cs)
	})
	eps, err := k.c.EndpointList(k.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 3 {
		t.Fatalf("%d endpoints after the slow period, want 3", len(eps))
	}
}
