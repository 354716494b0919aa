package netpol

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
	"github.com/membrane-cni/membrane/test/netpolmodel"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

func TestMain(m *testing.M) {
	// An API server for the Kubernetes-mode worlds.
	os.Exit(nodeharness.Run(func() int { return kubetest.Main(m) }))
}

// world is the 3x3 world: a netns standing in for the node, an agent on
// the Linux datapath in it, and nine pods made by membrane-cni.
type world struct {
	t     *testing.T
	node  *nodeharness.Node
	c     *client.Client
	pods  []*worldPod
	model []netpolmodel.Pod
	// kube is the API server of a Kubernetes-mode world (nil: policies
	// go in through PUT /v1/policy and pods are labelled through the
	// agent's API).
	kube kubernetes.Interface
}

// worldPod is one pod: its netns, runtime config and endpoint.
type worldPod struct {
	netpolmodel.Pod
	ns *testutil.NS
	rt *libcni.RuntimeConf
	ep *models.Endpoint
}

var (
	namespaces = []string{"x", "y", "z"}
	podNames   = []string{"a", "b", "c"}
	ports      = []int{80, 81}
)

func newWorld(t *testing.T, cidr string) *world { return newWorldWith(t, cidr, nil) }

// kubeNode is the node name of a Kubernetes-mode world's agent.
const kubeNode = "netpol-node"

// newWorldWith makes a world; with env it is in Kubernetes mode: the
// agent watches env's API server, the namespaces and pods are objects
// there (each pod's container declares the named ports serve-<port>-tcp
// and serve-<port>-udp, as upstream's pods do) and the agent labels the
// endpoints from them.
func newWorldWith(t *testing.T, cidr string, env *kubetest.Env) *world {
	t.Helper()
	return newWorldOpts(t, cidr, env, false)
}

// newWorldOpts is newWorldWith; ciliumKinds (Kubernetes mode) also
// installs Cilium's policy CRDs and has the agent read them
// (PolicyAPIGroups membrane.io and cilium.io).
func newWorldOpts(t *testing.T, cidr string, env *kubetest.Env, ciliumKinds bool) *world {
	t.Helper()
	testutil.RequireRoot(t)
	w := &world{t: t}
	if env != nil {
		if ciliumKinds {
			env.InstallCiliumCRDs(t)
		}
		w.kubeObjects(env) // removed after the agent stopped (cleanups run last-in first-out)
	}
	// The node's cleanup stops the agent after the pods' DELs.
	w.node = nodeharness.New(t, nodeharness.Options{Prefix: "mbt-netpol", IPv4Range: cidr, Network: "membrane-netpol"})
	w.node.StartAgent(func(cfg *agent.Config) {
		if env != nil {
			cfg.K8s = &k8s.Config{Kubeconfig: env.Kubeconfig, NodeName: kubeNode, PodWait: 30 * time.Second, SyncTimeout: time.Minute,
				Identity: k8s.IdentityConfig{Mode: k8s.IdentityLocal}}
			if ciliumKinds {
				cfg.K8s.PolicyAPIGroups = []string{k8s.GroupMembrane, k8s.GroupCilium}
			}
		}
	})
	w.c = w.node.Client()
	var wg sync.WaitGroup
	errs := make([]error, len(namespaces)*len(podNames))
	for _, ns := range namespaces {
		for _, name := range podNames {
			w.pods = append(w.pods, &worldPod{Pod: netpolmodel.Pod{NS: ns, Name: name, Labels: map[string]string{"pod": name}},
				ns: testutil.NewNS(t, "mbt-np")})
		}
	}
	for i, p := range w.pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = w.addPod(p)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range w.pods {
			if p.rt == nil {
				continue
			}
			if err := w.node.Do(func(ctx context.Context) error { return w.node.DelRT(ctx, p.rt) }); err != nil {
				t.Errorf("DEL %s: %v", p, err)
			}
		}
	})
	for _, p := range w.pods {
		w.model = append(w.model, p.Pod)
		for _, port := range ports {
			testutil.EchoServer(t, p.ns, p.IP, port)
			udpEchoServer(t, p.ns, p.IP, port)
		}
	}
	return w
}

// addPod runs CNI ADD for p in its namespace and labels its endpoint
// pod=<name>, as the agent's Kubernetes watcher would.
func (w *world) addPod(p *worldPod) error {
	id := "c" + testutil.RandomSuffix(24)
	rt := nodeharness.RuntimeConf(id, p.ns.Path, p.NS, p.Name)
	var res *types100.Result
	err := w.node.Do(func(ctx context.Context) (err error) {
		res, err = w.node.AddRT(ctx, rt)
		return err
	})
	if err != nil {
		return fmt.Errorf("ADD %s: %w", p, err)
	}
	p.rt = rt
	ip, ok := netip.AddrFromSlice(res.IPs[0].Address.IP.To4())
	if !ok {
		return fmt.Errorf("pod %s: no IPv4 address in %v", p, res)
	}
	p.IP = ip
	var ep *models.Endpoint
	if w.kube != nil {
		ep, err = w.c.EndpointGet(context.Background(), "container-id:"+id) // labelled from its pod object
	} else {
		ep, err = w.c.EndpointPatchLabels(context.Background(), "container-id:"+id, []string{"k8s:pod=" + p.Name}, nil)
	}
	if err != nil {
		return fmt.Errorf("label pod %s: %w", p, err)
	}
	p.ep = ep
	return nil
}

// kubeObjects creates the world's namespaces and pods in env's API
// server (removed at cleanup) and installs the CRDs the agent watches.
func (w *world) kubeObjects(env *kubetest.Env) {
	w.t.Helper()
	env.InstallCRDs(w.t)
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		w.t.Fatal(err)
	}
	w.kube = cs
	ctx := context.Background()
	var cports []corev1.ContainerPort
	for _, port := range ports {
		for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
			cports = append(cports, corev1.ContainerPort{Name: fmt.Sprintf("serve-%d-%s", port, strings.ToLower(string(proto))),
				ContainerPort: int32(port), Protocol: proto})
		}
	}
	// The namespaces stay for the package's next Kubernetes-mode world:
	// the test API server runs no namespace controller, so a deleted
	// namespace would stay terminating. The pods go at once (no grace:
	// there is no kubelet to confirm).
	for _, ns := range namespaces {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			w.t.Fatal(err)
		}
		for _, name := range podNames {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"pod": name}},
				Spec: corev1.PodSpec{NodeName: kubeNode, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause", Ports: cports}}}}
			if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				w.t.Fatal(err)
			}
			w.t.Cleanup(func() {
				_ = cs.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
			})
		}
	}
}

// pod returns the world's pod ns/name.
func (w *world) pod(ns, name string) *worldPod {
	for _, p := range w.pods {
		if p.NS == ns && p.Name == name {
			return p
		}
	}
	w.t.Fatalf("no pod %s/%s", ns, name)
	return nil
}

// udpEchoServer answers every datagram to addr:port inside ns with
// itself until tb ends.
func udpEchoServer(tb testing.TB, ns *testutil.NS, addr netip.Addr, port int) {
	tb.Helper()
	var pc net.PacketConn
	if err := ns.Do(func() error {
		var err error
		pc, err = net.ListenPacket("udp", net.JoinHostPort(addr.String(), strconv.Itoa(port)))
		return err
	}); err != nil {
		tb.Fatalf("udp echo server on %s:%d: %v", addr, port, err)
	}
	tb.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
}

// udpExchange sends a datagram from inside ns to addr:port and waits up
// to timeout (a bound for a datagram policy drops, not a timing
// assertion) for the echo.
func udpExchange(ns *testutil.NS, addr netip.Addr, port int, timeout time.Duration) error {
	return ns.Do(func() error {
		c, err := net.Dial("udp", net.JoinHostPort(addr.String(), strconv.Itoa(port)))
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		msg := []byte("membrane-netpol")
		if _, err := c.Write(msg); err != nil {
			return err
		}
		got := make([]byte, 64)
		n, err := c.Read(got)
		if err != nil {
			return err
		}
		if !bytes.Equal(got[:n], msg) {
			return fmt.Errorf("echo %q, want %q", got[:n], msg)
		}
		return nil
	})
}

// probe reports whether src reaches dst on k within timeout: a TCP
// connection and an echo both ways, a UDP datagram and its echo, or (k's
// protocol ICMP) an ICMP echo request and its reply.
func probe(src, dst *worldPod, k netpolmodel.ProbeKey, timeout time.Duration) bool {
	switch k.Proto {
	case "UDP":
		return udpExchange(src.ns, dst.IP, k.Port, timeout) == nil
	case "ICMP":
		return testutil.Ping(src.ns, dst.IP, timeout) == nil
	}
	return testutil.Exchange(src.ns, dst.IP, k.Port, timeout) == nil
}

// Probe bounds. A denied probe costs its whole timeout, so the first
// round is short; a cell that disagrees with the model is probed again
// with retryTimeout before it counts (a slow allowed connection on a
// loaded machine is not a denial). Neither is a timing assertion.
const (
	probeTimeout  = 700 * time.Millisecond
	retryTimeout  = 3 * time.Second
	probeParallel = 48
)

// observe probes every pair for k, at most probeParallel at once. want,
// when given, selects the cells to probe again with retryTimeout.
func (w *world) observe(k netpolmodel.ProbeKey, want netpolmodel.Matrix) netpolmodel.Matrix {
	n := len(w.pods)
	got := netpolmodel.NewMatrix(n)
	sem := make(chan struct{}, probeParallel)
	var wg sync.WaitGroup
	for i, src := range w.pods {
		for j, dst := range w.pods {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				ok := probe(src, dst, k, probeTimeout)
				if !ok && want != nil && want[i][j] {
					ok = probe(src, dst, k, retryTimeout)
				}
				got[i][j] = ok
			}()
		}
	}
	wg.Wait()
	return got
}

// apply replaces the agent's policies with pols (PUT /v1/policy of each,
// DELETE of the others).
func (w *world) apply(pols []*netpolmodel.Policy) {
	w.t.Helper()
	ctx := context.Background()
	list, err := w.c.PolicyList(ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	keep := map[string]bool{}
	for _, p := range pols {
		doc, err := json.Marshal(p)
		if err != nil {
			w.t.Fatal(err)
		}
		if _, err := w.c.PolicyImport(ctx, doc, client.ContentTypeJSON); err != nil {
			w.t.Fatalf("import %s/%s: %v\n%s", p.Metadata.Namespace, p.Metadata.Name, err, doc)
		}
		keep[p.Metadata.Namespace+"/"+p.Metadata.Name] = true
	}
	for _, p := range list.Policies {
		if name := p.Namespace + "/" + p.Name; !keep[name] {
			if _, err := w.c.PolicyDelete(ctx, name); err != nil {
				w.t.Fatalf("delete %s: %v", name, err)
			}
		}
	}
}

// settle waits (bounded) until every endpoint is ready and its realised
// policy (identity and CIDR entries, enforcement) equals its computed
// one, as GET /v1/endpoint/{id}/policy reports them.
func (w *world) settle() {
	w.t.Helper()
	testutil.EventuallyErr(w.t, "policy realised", func() error {
		for _, p := range w.pods {
			if why := w.pending(p); why != "" {
				return fmt.Errorf("%s: %s", p, why)
			}
		}
		return nil
	})
}

func (w *world) pending(p *worldPod) string {
	ctx := context.Background()
	ep, err := w.c.EndpointGet(ctx, strconv.FormatInt(p.ep.ID, 10))
	if err != nil {
		return err.Error()
	}
	if ep.State != "ready" {
		return "state " + ep.State
	}
	pol, err := w.c.EndpointPolicy(ctx, strconv.FormatInt(p.ep.ID, 10))
	switch {
	case err != nil:
		return err.Error()
	case pol.RealizedError != "":
		return pol.RealizedError
	case pol.IngressEnforced != pol.RealizedIngressEnforced || pol.EgressEnforced != pol.RealizedEgressEnforced:
		return "enforcement not realised"
	case len(pol.Computed) != len(pol.Realized) || len(pol.ComputedCIDR) != len(pol.RealizedCIDR):
		return "entries not realised"
	}
	for i := range pol.Computed {
		if pol.Computed[i] != pol.Realized[i].PolicyEntry {
			return "entries differ"
		}
	}
	for i := range pol.ComputedCIDR {
		if pol.ComputedCIDR[i] != pol.RealizedCIDR[i].CIDRPolicyEntry {
			return "cidr entries differ"
		}
	}
	return ""
}
