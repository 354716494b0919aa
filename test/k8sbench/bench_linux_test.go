// Package k8sbench measures the Kubernetes mode's latencies on the Linux
// datapath with real BPF programs, against a real kube-apiserver: a pod
// relabel until the new identity is realised, and a NetworkPolicy's
// creation until every selected endpoint enforces it. Opt-in (make
// bench-k8s), root.
package k8sbench

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

const (
	node = "bench-node"
	ns   = "kbench"
)

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

type bench struct {
	t   *testing.T
	ctx context.Context
	cs  kubernetes.Interface
	c   *client.Client
	nl  *netlink.Handle
	eps []*models.Endpoint
	// links counts the host veths made (their names).
	links int
}

// TestK8sBench: BENCH_RELABEL_PODS (default 100) pods with endpoints,
// each relabelled once (new identity), then BENCH_POLICY_ENDPOINTS
// (default 200) endpoints and BENCH_POLICY_ROUNDS (default 100)
// NetworkPolicies created selecting all of them.
func TestK8sBench(t *testing.T) {
	if os.Getenv("MEMBRANE_BENCH_K8S") == "" {
		t.Skip("set MEMBRANE_BENCH_K8S=1 (make bench-k8s) to run the Kubernetes benchmark")
	}
	testutil.RequireRoot(t)
	env := kubetest.StartOwn(t)
	env.InstallCRDs(t)
	nPods, nEps, rounds := envInt("BENCH_RELABEL_PODS", 100), envInt("BENCH_POLICY_ENDPOINTS", 200), envInt("BENCH_POLICY_ROUNDS", 100)
	b := start(t, env)
	b.namespace()
	probe := b.addPod("probe", map[string]string{"app": "probe"})
	b.createNP(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "probe-from-gen"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "probe"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "gen", Operator: metav1.LabelSelectorOpExists}}}}}}}}})
	for i := range nPods {
		b.eps = append(b.eps, b.addPod(fmt.Sprintf("bench-%d", i), map[string]string{"app": "bench"}))
	}
	own, peer := b.relabelAll(probe)
	report(t, fmt.Sprintf("pod relabel until the endpoint realised its new identity (%d pods)", nPods), own)
	report(t, fmt.Sprintf("pod relabel until the new identity is in a peer's BPF policy map (%d pods)", nPods), peer)
	report(t, fmt.Sprintf("all %d pods relabelled at once: each until its endpoint realised its new identity", nPods), b.relabelBurst())
	for i := nPods; i < nEps; i++ {
		b.eps = append(b.eps, b.addPod(fmt.Sprintf("bench-%d", i), map[string]string{"app": "bench"}))
	}
	report(t, fmt.Sprintf("NetworkPolicy created until %d endpoints enforce it", len(b.eps)), b.policyRounds(rounds))
}

func start(t *testing.T, env *kubetest.Env) *bench {
	t.Helper()
	hn := nodeharness.New(t, nodeharness.Options{Prefix: "mbk-host", IPv4Range: "10.233.0.0/20", Log: logOut(), Debug: os.Getenv("BENCH_LOG") != ""})
	hn.StartAgent(func(cfg *agent.Config) {
		// The harness's configuration with the default garbage
		// collection and no delete queue.
		cfg.GCInterval, cfg.DeleteQueueDir, cfg.DeleteQueueInterval = 0, "", 0
		// The agent's clients limited as its flags' defaults limit them
		// in a cluster (the test's own client is not).
		rc := rest.CopyConfig(env.Config)
		rc.QPS, rc.Burst = k8s.DefaultClientQPS, k8s.DefaultClientBurst
		cfg.K8s = &k8s.Config{REST: rc, NodeName: node, SyncTimeout: time.Minute, PodWait: 30 * time.Second}
		// BENCH_RELEASE_DELAY: the identity actor's ReleaseDelay (a
		// duration; negative releases at once), to compare.
		if d, err := time.ParseDuration(os.Getenv("BENCH_RELEASE_DELAY")); err == nil {
			cfg.Actors.ClusterIdentity.ReleaseDelay = d
		}
	})
	c := hn.Client()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return &bench{t: t, ctx: context.Background(), cs: cs, c: c, nl: hn.NS.Netlink(t)}
}

func (b *bench) namespace() {
	b.retry("create namespace", func() error {
		_, err := b.cs.CoreV1().Namespaces().Create(b.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		return err
	})
}

// retry retries call while the API server answers with a timeout or an
// overload (a freshly started API server on a loaded machine), for up to
// two minutes.
func (b *bench) retry(what string, call func() error) {
	b.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := call()
		if err == nil {
			return
		}
		transient := apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err) ||
			apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err)
		if !transient || time.Now().After(deadline) {
			b.t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (b *bench) createNP(np *networkingv1.NetworkPolicy) {
	b.retry("create networkpolicy", func() error {
		_, err := b.cs.NetworkingV1().NetworkPolicies(ns).Create(b.ctx, np, metav1.CreateOptions{})
		return err
	})
}

// addPod creates the pod and its endpoint (host veth, BPF programs) as
// membrane-cni's ADD would.
func (b *bench) addPod(name string, lbls map[string]string) *models.Endpoint {
	t := b.t
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause"}}}}
	b.retry("create pod", func() error {
		_, err := b.cs.CoreV1().Pods(ns).Create(b.ctx, pod, metav1.CreateOptions{})
		return err
	})
	b.links++
	i := b.links
	attrs := netlink.NewLinkAttrs()
	attrs.Name = fmt.Sprintf("lxck%d", i)
	if err := b.nl.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: fmt.Sprintf("pk%d", i)}); err != nil {
		t.Fatalf("veth %s: %v", attrs.Name, err)
	}
	link, err := b.nl.LinkByName(attrs.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.nl.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	ip, err := b.c.IPAMAllocate(b.ctx, "ipv4", ns+"/"+name)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := b.c.EndpointCreate(b.ctx, "0", &models.EndpointChangeRequest{ContainerID: "ctr-" + name, K8sNamespace: ns, K8sPodName: name,
		Labels: []string{"k8s:io.kubernetes.pod.namespace=" + ns}, Addressing: &models.AddressPair{IPv4: ip.IPv4.IP},
		InterfaceName: attrs.Name, InterfaceIndex: int64(link.Attrs().Index), SyncBuild: true})
	if err != nil {
		t.Fatalf("create endpoint %s: %v", name, err)
	}
	if ep.State != "ready" || !slices.Contains(ep.Labels, "k8s:app="+lbls["app"]) {
		t.Fatalf("endpoint %s: state %s labels %v", name, ep.State, ep.Labels)
	}
	return ep
}

// relabelAll relabels each bench pod once (gen=<n>: a label set no
// endpoint had, so a new identity) and returns, per pod, the time from the
// update until (own) the endpoint completed the regeneration that loaded
// its program with the new identity, and until (peer) the probe
// endpoint's BPF policy map, read back from the kernel, admits it.
func (b *bench) relabelAll(probe *models.Endpoint) (own, peer []time.Duration) {
	t := b.t
	for i, ep := range b.eps {
		name := fmt.Sprintf("bench-%d", i)
		pod, err := b.cs.CoreV1().Pods(ns).Get(b.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod.Labels["gen"] = strconv.Itoa(i)
		old := ep.Identity.ID
		start := time.Now()
		if _, err := b.cs.CoreV1().Pods(ns).Update(b.ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		var id int64
		b.poll("relabel "+name, func() bool {
			got, err := b.c.EndpointGet(b.ctx, strconv.FormatInt(ep.ID, 10))
			if err != nil {
				t.Fatal(err)
			}
			ok := got.Identity != nil && got.Identity.ID != old && slices.Equal(got.Identity.Labels, got.Labels) &&
				slices.Contains(got.Labels, "k8s:gen="+strconv.Itoa(i)) && got.State == "ready" && got.Regenerations > ep.Regenerations
			if ok {
				id, b.eps[i] = got.Identity.ID, got
			}
			return ok
		})
		own = append(own, time.Since(start))
		b.poll("probe admits "+name, func() bool { return slices.Contains(b.realizedFrom(probe.ID, 0), uint32(id)) })
		peer = append(peer, time.Since(start))
	}
	return own, peer
}

// relabelBurst relabels every bench pod at once (gen=b<n>): the updates
// go out from burstClients goroutines together while a poller watches
// the endpoints from before the first one, and it returns, per pod, the
// time from its update until its endpoint completed the regeneration
// with the new identity. (Issuing the updates one by one and polling
// only after the last one measured mostly the issuing: the first pod's
// time included the ninety-nine updates after it.)
func (b *bench) relabelBurst() []time.Duration {
	t := b.t
	pods := make([]*corev1.Pod, len(b.eps))
	for i := range b.eps {
		pod, err := b.cs.CoreV1().Pods(ns).Get(b.ctx, fmt.Sprintf("bench-%d", i), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod.Labels["gen"] = "b" + strconv.Itoa(i)
		pods[i] = pod
	}
	var mu sync.Mutex
	starts := make([]time.Time, len(b.eps))
	took := make([]time.Duration, len(b.eps))
	done := make(chan struct{})
	polled := make(chan error, 1)
	go func() {
		pending := len(b.eps)
		deadline := time.Now().Add(2 * time.Minute)
		for pending > 0 {
			if time.Now().After(deadline) {
				polled <- fmt.Errorf("burst relabel: %d pods not realised after 2 minutes", pending)
				return
			}
			eps, err := b.c.EndpointList(b.ctx, nil)
			if err != nil {
				polled <- err
				return
			}
			now := time.Now()
			byID := map[int64]*models.Endpoint{}
			for _, ep := range eps {
				byID[ep.ID] = ep
			}
			mu.Lock()
			for i, ep := range b.eps {
				got := byID[ep.ID]
				if took[i] != 0 || starts[i].IsZero() || got == nil || got.Identity == nil {
					continue
				}
				if slices.Contains(got.Labels, "k8s:gen=b"+strconv.Itoa(i)) && slices.Equal(got.Identity.Labels, got.Labels) &&
					got.Identity.ID != ep.Identity.ID && got.State == "ready" && got.Regenerations > ep.Regenerations {
					took[i] = now.Sub(starts[i])
					b.eps[i] = got
					pending--
				}
			}
			mu.Unlock()
			select {
			case <-done:
			case <-time.After(pollEvery):
			}
		}
		polled <- nil
	}()
	work := make(chan int)
	var wg sync.WaitGroup
	errs := make(chan error, len(pods))
	issued := time.Now()
	for range burstClients {
		wg.Go(func() {
			for i := range work {
				mu.Lock()
				starts[i] = time.Now()
				mu.Unlock()
				if _, err := b.cs.CoreV1().Pods(ns).Update(b.ctx, pods[i], metav1.UpdateOptions{}); err != nil {
					errs <- fmt.Errorf("update %s: %w", pods[i].Name, err)
				}
				if os.Getenv("BENCH_LOG") != "" {
					// For a per-phase breakdown against the agent's log.
					fmt.Fprintf(os.Stderr, "BURST endpoint=%d update-start=%s update-done=%s\n", b.eps[i].ID,
						starts[i].UTC().Format(time.RFC3339Nano), time.Now().UTC().Format(time.RFC3339Nano))
				}
			}
		})
	}
	for i := range pods {
		work <- i
	}
	close(work)
	wg.Wait()
	t.Logf("burst: %d updates issued in %v from %d clients", len(pods), time.Since(issued).Round(time.Millisecond), burstClients)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := <-polled; err != nil {
		t.Fatal(err)
	}
	close(done)
	return took
}

// burstClients is how many updates of relabelBurst are in flight at once.
const burstClients = 20

// realizedFrom returns the ingress identities the endpoint's BPF policy
// map (dumped from the kernel) admits on TCP port.
func (b *bench) realizedFrom(id int64, port uint16) []uint32 {
	p, err := b.c.EndpointPolicy(b.ctx, strconv.FormatInt(id, 10))
	if err != nil {
		b.t.Fatal(err)
	}
	var out []uint32
	for _, e := range p.Realized {
		if e.Direction == "ingress" && e.Port == port {
			out = append(out, e.Identity)
		}
	}
	return out
}

// policyRounds creates a NetworkPolicy selecting every bench endpoint
// (ingress on a new port each round) and times until every endpoint
// completed a regeneration after it; then checks each endpoint's policy
// map, read back from the kernel, holds the port, and deletes the policy
// (waiting for that to be realised too) before the next round.
func (b *bench) policyRounds(rounds int) []time.Duration {
	var out []time.Duration
	for r := range rounds {
		port := int32(9000 + r)
		before := b.regenerations()
		p := intstr.FromInt32(port)
		tcp := corev1.ProtocolTCP
		start := time.Now()
		b.createNP(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("round-%d", r)},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "bench"}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p}}}}}})
		b.waitRegenerated(before)
		out = append(out, time.Since(start))
		for _, ep := range b.eps {
			pol, err := b.c.EndpointPolicy(b.ctx, strconv.FormatInt(ep.ID, 10))
			if err != nil {
				b.t.Fatal(err)
			}
			if !pol.RealizedIngressEnforced || !slices.ContainsFunc(pol.Realized, func(e models.RealizedPolicyEntry) bool {
				return e.Direction == "ingress" && int32(e.Port) == port
			}) {
				b.t.Fatalf("round %d: endpoint %d's policy map lacks port %d: %+v", r, ep.ID, port, pol.Realized)
			}
		}
		before = b.regenerations()
		if err := b.cs.NetworkingV1().NetworkPolicies(ns).Delete(b.ctx, fmt.Sprintf("round-%d", r), metav1.DeleteOptions{}); err != nil {
			b.t.Fatal(err)
		}
		b.waitRegenerated(before)
	}
	return out
}

func (b *bench) regenerations() map[int64]uint64 {
	m := make(map[int64]uint64, len(b.eps))
	for _, ep := range b.list() {
		m[ep.ID] = ep.Regenerations
	}
	return m
}

func (b *bench) list() []*models.Endpoint {
	eps, err := b.c.EndpointList(b.ctx, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	return eps
}

// waitRegenerated waits until every bench endpoint completed a
// regeneration after before and is ready.
func (b *bench) waitRegenerated(before map[int64]uint64) {
	want := map[int64]bool{}
	for _, ep := range b.eps {
		want[ep.ID] = true
	}
	b.poll("regenerations", func() bool {
		done := 0
		for _, ep := range b.list() {
			if want[ep.ID] && ep.Regenerations > before[ep.ID] && ep.State == "ready" {
				done++
			}
		}
		return done == len(want)
	})
}

// poll checks cond every millisecond for up to two minutes.
func (b *bench) poll(what string, cond func() bool) {
	b.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			b.t.Fatalf("%s: not done after 2 minutes", what)
		}
		time.Sleep(pollEvery)
	}
}

// pollEvery is the period of poll's checks. Each lists every endpoint
// through the agent's API: a tighter loop (it was 1 ms) is itself a load
// on the agent that the burst's latencies then include; 10 ms is the
// resolution the results keep.
const pollEvery = 10 * time.Millisecond

func report(t *testing.T, what string, d []time.Duration) {
	slices.Sort(d)
	q := func(p float64) time.Duration { return d[min(len(d)-1, int(p*float64(len(d))))] }
	line := fmt.Sprintf("%s: n=%d median %v p90 %v p99 %v max %v", what, len(d),
		q(0.5).Round(100*time.Microsecond), q(0.9).Round(100*time.Microsecond), q(0.99).Round(100*time.Microsecond), d[len(d)-1].Round(100*time.Microsecond))
	t.Log(line)
	fmt.Println(line)
}

// logOut is where the agent logs: stderr with BENCH_LOG=1.
func logOut() io.Writer {
	if os.Getenv("BENCH_LOG") != "" {
		return os.Stderr
	}
	return io.Discard
}
