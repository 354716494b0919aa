//go:build linux

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestUpgradeUnderTraffic rolls the DaemonSet from image versionA to
// versionB (two builds differing in the version string), as helm upgrade
// does (the chart rendered with the new tag and applied), and back, while
// flows run from a pod on node-0 to a pod on node-1, directly and through
// a ClusterIP Service: a TCP connection each (one line exchanged every
// 10 ms) and a UDP flow each (a numbered datagram every 10 ms, echoed;
// lost = sent minus the distinct numbers echoed back, so a loss either
// way counts). Meanwhile a NetworkPolicy admits only the client's label
// to the server and a denied pod probes it every 200 ms. Each roll must
// lose no datagram, break no connection, admit no denied probe and
// restart or recreate no pod (restart counts, pod UIDs and the sandbox
// IDs the agents hold unchanged). Each node's agent downtime is measured
// on its API socket, polled every 20 ms: from the last answer of the old
// agent to the first "ok" of the new one.
func TestUpgradeUnderTraffic(t *testing.T) {
	c := requireCluster(t)
	if len(c.nodes) < 2 {
		t.Skip("needs 2 nodes (E2E_NODES)")
	}
	if c.cni != "membrane" || c.agentFlags == nil {
		t.Skip("needs the DaemonSet")
	}
	n0, n1 := c.nodes[0], c.nodes[1]
	for _, n := range c.nodes {
		if v := agentVersion(n); v != versionA {
			t.Fatalf("agent on %s is version %q, want %s before the upgrade", n.name, v, versionA)
		}
	}
	ctx := context.Background()
	ns := c.namespace(t, "upgrade", nil)
	pods := c.createPods(t,
		podSpec(ns, "client", n0.name, map[string]string{"app": "client"}),
		podSpec(ns, "server", n1.name, map[string]string{"app": "server"}),
		podSpec(ns, "denied", n0.name, map[string]string{"app": "denied"}))
	client, server, denied := pods[ns+"/client"], pods[ns+"/server"], pods[ns+"/denied"]
	svcIP := c.tcpUDPService(t, ns, "server", "app", "server")
	_, err := c.client.NetworkingV1().NetworkPolicies(ns).Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "server-from-client"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fromClient, fromDenied := mustNetns(t, client), mustNetns(t, denied)
	testutil.EventuallyErr(t, "denied pod refused", func() error { return reachable(fromDenied, server, 80, "tcp", false) })
	testutil.EventuallyErr(t, "client admitted", func() error { return reachable(fromClient, server, 80, "tcp", true) })
	testutil.EventuallyErr(t, "client reaches the Service", func() error {
		return answers(fromClient, svcIP, 80, "tcp", ns+"/server")
	})
	testutil.EventuallyErr(t, "client reaches the Service over UDP", func() error {
		return answers(fromClient, svcIP, 81, "udp", ns+"/server")
	})
	before := c.podIdentities(t, ns)

	for _, to := range []string{versionB, versionA} {
		serverIP := podIP(t, server)
		flows := []struct {
			name string
			tcp  func() (int, error)
			udp  func() (int, int)
		}{
			{"pod to pod", startTCPFlow(t, fromClient, serverIP), startUDPFlow(t, fromClient, serverIP)},
			{"through the Service", startTCPFlow(t, fromClient, svcIP), startUDPFlow(t, fromClient, svcIP)},
		}
		probe := startDeniedProbe(fromDenied, serverIP)
		watchers := map[string]*downtimeWatch{}
		for _, n := range c.nodes {
			watchers[n.name] = watchDowntime(n)
		}
		time.Sleep(time.Second) // traffic before the roll
		t0 := time.Now()
		if err := c.installMembrane(ctx, to); err != nil {
			t.Fatal(err)
		}
		for _, n := range []*node{n0, n1} {
			if err := testutil.WaitFor(5*time.Minute, func() bool { return agentVersion(n) == to }); err != nil {
				t.Fatalf("%s's agent never answered as %s: %v", n.name, to, err)
			}
		}
		newPods := map[string]*corev1.Pod{}
		for _, n := range c.nodes {
			p, err := c.waitAgentPod(ctx, n, 3*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			newPods[n.name] = p
		}
		rolled := time.Since(t0)
		time.Sleep(time.Second) // traffic after the roll
		for _, f := range flows {
			sent, lost := f.udp()
			exchanges, tcpErr := f.tcp()
			t.Logf("to %s, %s: UDP %d datagrams, %d lost; TCP %d exchanges on one connection", to, f.name, sent, lost, exchanges)
			if lost != 0 {
				t.Errorf("to %s, %s: %d of %d datagrams lost", to, f.name, lost, sent)
			}
			if tcpErr != nil {
				t.Errorf("to %s, %s: the TCP connection broke: %v", to, f.name, tcpErr)
			}
		}
		tries, admitted := probe()
		t.Logf("to %s: denied probe %d tries, %d admitted", to, tries, admitted)
		if admitted != 0 || tries == 0 {
			t.Errorf("to %s: the NetworkPolicy let %d of %d denied probes through", to, admitted, tries)
		}
		var downs []string
		for _, n := range c.nodes {
			d, err := watchers[n.name].stop(to)
			if err != nil {
				t.Errorf("to %s: %s: %v", to, n.name, err)
				continue
			}
			downs = append(downs, fmt.Sprintf("%s %s (%s)", n.name, d.total.Round(time.Millisecond), d.phases(newPods[n.name])))
		}
		t.Logf("to %s: rolled in %s; agent downtime (old agent's last answer to new agent's first ok): %s",
			to, rolled.Round(time.Millisecond), strings.Join(downs, ", "))
		if after := c.podIdentities(t, ns); after != before {
			t.Errorf("to %s: pods changed:\nbefore %s\nafter  %s", to, before, after)
		}
	}
}

// agentVersion is the version n's agent reports ("" when it does not
// answer "ok").
func agentVersion(n *node) string {
	cl := client.New(n.agentSocket())
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := cl.Status(ctx)
	if err != nil {
		return ""
	}
	return st.Version
}

// downtimeWatch polls a node's agent every 20 ms.
type downtimeWatch struct {
	done     atomic.Bool
	finished chan struct{}
	mu       sync.Mutex
	samples  []sample
}

type sample struct {
	at      time.Time
	version string // "" while no agent answers ok
}

func watchDowntime(n *node) *downtimeWatch {
	w := &downtimeWatch{finished: make(chan struct{})}
	go func() {
		defer close(w.finished)
		for !w.done.Load() {
			v := agentVersion(n)
			w.mu.Lock()
			w.samples = append(w.samples, sample{time.Now(), v})
			w.mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return w
}

// downtime is one node's: from the old agent's last answer to the new
// one's first "ok".
type downtime struct {
	lastOld, firstNew time.Time
	total             time.Duration
}

// phases splits the downtime by the new pod's status (whole seconds, as
// the API reports them): until the DaemonSet controller created the new
// pod (the old agent's stop, its pod's removal), until its agent
// container started (sandbox, mount-bpffs, install-cni), until the agent
// answered ok (restore, Kubernetes caches).
func (d downtime) phases(p *corev1.Pod) string {
	if p == nil {
		return "?"
	}
	var started time.Time
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == "agent" && cs.State.Running != nil {
			started = cs.State.Running.StartedAt.Time
		}
	}
	created := p.CreationTimestamp.Time
	return fmt.Sprintf("old agent gone to new pod created %s, to agent container started %s, to agent ok %s",
		created.Sub(d.lastOld).Round(100*time.Millisecond), started.Sub(created).Round(time.Second),
		d.firstNew.Sub(started).Round(100*time.Millisecond))
}

// stop ends the watch and returns the time from the last answer of an
// agent of another version than to until the first of version to.
func (w *downtimeWatch) stop(to string) (downtime, error) {
	w.done.Store(true)
	<-w.finished
	var lastOld, firstNew time.Time
	for _, s := range w.samples {
		switch {
		case s.version == to && firstNew.IsZero():
			firstNew = s.at
		case s.version != "" && s.version != to:
			if !firstNew.IsZero() {
				return downtime{}, fmt.Errorf("an agent of version %s answered after one of %s", s.version, to)
			}
			lastOld = s.at
		}
	}
	if lastOld.IsZero() || firstNew.IsZero() {
		return downtime{}, fmt.Errorf("no old and new agent seen (%d samples)", len(w.samples))
	}
	return downtime{lastOld: lastOld, firstNew: firstNew, total: firstNew.Sub(lastOld)}, nil
}

// startDeniedProbe dials to:80 over TCP from the netns at from every
// 200 ms (a 500 ms timeout each); stop returns the tries and how many
// connected.
func startDeniedProbe(from string, to netip.Addr) (stop func() (tries, admitted int)) {
	var done atomic.Bool
	var n, ok int
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for !done.Load() {
			if dialTCP(from, to, 80, 500*time.Millisecond) == nil {
				ok++
			}
			n++
			time.Sleep(200 * time.Millisecond)
		}
	}()
	return func() (int, int) {
		done.Store(true)
		<-finished
		return n, ok
	}
}

// tcpUDPService creates a ClusterIP Service on TCP 80 and UDP 81 selecting
// the pods labelled key=value and returns its ClusterIP.
func (c *cluster) tcpUDPService(t *testing.T, ns, name, key, value string) netip.Addr {
	t.Helper()
	svc, err := c.client.CoreV1().Services(ns).Create(context.Background(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{key: value},
			Ports: []corev1.ServicePort{
				{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)},
				{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 81, TargetPort: intstr.FromInt32(81)},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		t.Fatalf("Service %s/%s ClusterIP %q: %v", ns, name, svc.Spec.ClusterIP, err)
	}
	return ip
}

// podIdentities describes ns's pods as what must not change across an
// upgrade: UID, IP, each container's restart count, and the sandbox ID
// (the CNI container ID) of the endpoint their node's agent holds.
func (c *cluster) podIdentities(t *testing.T, ns string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sandboxes := map[string]string{}
	for _, n := range c.nodes {
		cl := client.New(n.agentSocket())
		eps, err := cl.EndpointList(ctx, nil)
		cl.Close()
		if err != nil {
			t.Fatalf("endpoints on %s: %v", n.name, err)
		}
		for _, ep := range eps {
			if ep.K8sNamespace == ns {
				sandboxes[ep.K8sPodName] = fmt.Sprintf("%s/%d/%.12s", n.name, ep.ID, ep.ContainerID)
			}
		}
	}
	pods, err := c.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range pods.Items {
		restarts := 0
		for _, cs := range p.Status.ContainerStatuses {
			restarts += int(cs.RestartCount)
		}
		out = append(out, fmt.Sprintf("%s{uid %.8s ip %s restarts %d sandbox %s}", p.Name, p.UID, p.Status.PodIP, restarts, sandboxes[p.Name]))
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}
