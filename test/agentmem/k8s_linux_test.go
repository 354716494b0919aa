package agentmem

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

const (
	memNode = "mem-node"
	memNS   = "mem"
	// remoteIdentities is how many identities the remote endpoints
	// share (MembraneIdentity objects, as other nodes' agents make).
	remoteIdentities = 250
	firstRemoteID    = 20000
)

// TestMemKubernetes: the agent process in Kubernetes mode (crd
// identities) against a real kube-apiserver: MEM_REMOTE (default 5,000)
// MembraneEndpoints of MEM_REMOTE_NODES (default 50) other nodes, whose
// Node objects hold their addresses, over 250 MembraneIdentities; then
// MEM_PODS (default 110) pods of this node added by the real
// membrane-cni. Measured idle with the remote endpoints, and with the
// pods too, after MEM_SETTLE each; then the CPU over MEM_IDLE.
func TestMemKubernetes(t *testing.T) {
	requireBench(t)
	pods, remote, nodes := envInt("MEM_PODS", 110), envInt("MEM_REMOTE", 5000), max(envInt("MEM_REMOTE_NODES", 50), 1)
	settle := envDuration("MEM_SETTLE", 15*time.Second)
	env := kubetest.StartOwn(t)
	env.InstallCRDs(t)
	rc := rest.CopyConfig(env.Config)
	rc.QPS, rc.Burst = 1000, 2000
	cs := kubernetes.NewForConfigOrDie(rc)
	dyn := dynamic.NewForConfigOrDie(rc)
	ctx := context.Background()
	retry(t, "namespace", func() error {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: memNS}}, metav1.CreateOptions{})
		return err
	})
	createNode(t, cs, memNode, "10.231.0.0/20", "192.0.2.1")
	for i := range nodes {
		createNode(t, cs, fmt.Sprintf("mem-remote-%d", i), fmt.Sprintf("10.%d.%d.0/24", 64+i/256, i%256), fmt.Sprintf("192.0.2.%d", 10+i))
	}
	parallel(t, min(remote, remoteIdentities), func(i int) error {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": v2.GroupVersion.String(), "kind": v2.IdentityKind,
			"metadata":        map[string]any{"name": strconv.Itoa(firstRemoteID + i)},
			"security-labels": map[string]any{"k8s:app": fmt.Sprintf("remote-%d", i), "k8s:io.kubernetes.pod.namespace": memNS}}}
		_, err := dyn.Resource(v2.IdentityResource).Create(ctx, u, metav1.CreateOptions{})
		return err
	})
	perNode := (remote + nodes - 1) / nodes
	parallel(t, remote, func(i int) error {
		nd := i / perNode
		ip := fmt.Sprintf("10.%d.%d.%d", 64+nd/256, nd%256, 1+i%perNode)
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": v2.GroupVersion.String(), "kind": v2.EndpointKind,
			"metadata": map[string]any{"name": fmt.Sprintf("remote-%05d", i), "namespace": memNS,
				"labels": map[string]any{v2.EndpointNodeLabel: fmt.Sprintf("mem-remote-%d", nd)}},
			"status": map[string]any{"id": int64(1 + i%perNode), "state": "ready", "policyRevision": int64(1),
				"identity":   map[string]any{"id": int64(firstRemoteID + i%remoteIdentities), "labels": []any{fmt.Sprintf("k8s:app=remote-%d", i%remoteIdentities)}},
				"networking": map[string]any{"ipv4": ip, "nodeName": fmt.Sprintf("mem-remote-%d", nd), "nodeIP": fmt.Sprintf("192.0.2.%d", 10+nd)}}}}
		_, err := dyn.Resource(v2.Resource(v2.EndpointResource)).Namespace(memNS).Create(ctx, u, metav1.CreateOptions{})
		return err
	})
	n := nodeharness.New(t, nodeharness.Options{Prefix: "mbm-k8s", IPv4Range: "10.231.0.0/20"})
	u, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	forward(t, n.NS, u.Host)
	p := agentProc(n, "--k8s-kubeconfig", env.Kubeconfig, "--node-name", memNode,
		"--identity-allocation-mode", "crd", "--policy-api-groups", "membrane.io", "--policy-secrets-namespace", "membrane-secrets")
	p.Start()
	waitRemote(t, n.Socket, remote)
	time.Sleep(settle)
	report(t, measure(t, fmt.Sprintf("Kubernetes mode, %d remote endpoints", remote), p.Pid(), n.Socket, false), "")
	parallel(t, pods, func(i int) error {
		_, err := cs.CoreV1().Pods(memNS).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: memNS, Name: fmt.Sprintf("mem-%d", i),
			Labels: map[string]string{"app": fmt.Sprintf("local-%d", i%10)}},
			Spec: corev1.PodSpec{NodeName: memNode, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause"}}}}, metav1.CreateOptions{})
		return err
	})
	for i := range pods {
		n.AddPodIn(memNS, fmt.Sprintf("mem-%d", i))
	}
	time.Sleep(settle)
	report(t, measure(t, fmt.Sprintf("Kubernetes mode, %d pods and %d remote endpoints", pods, remote), p.Pid(), n.Socket, true), "<= 64")
	idle(t, "Kubernetes mode", p.Pid(), n.Socket)
}

func createNode(t *testing.T, cs kubernetes.Interface, name, cidr, ip string) {
	t.Helper()
	ctx := context.Background()
	var nd *corev1.Node
	retry(t, "node "+name, func() error {
		var err error
		nd, err = cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}}}, metav1.CreateOptions{})
		return err
	})
	nd.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}
	retry(t, "node status "+name, func() error {
		_, err := cs.CoreV1().Nodes().UpdateStatus(ctx, nd, metav1.UpdateOptions{})
		return err
	})
}

// retry retries call while the API server answers with a timeout or an
// overload (a fresh API server on a loaded machine), for two minutes.
func retry(t *testing.T, what string, call func() error) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := call()
		if err == nil {
			return
		}
		transient := apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err) ||
			apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err)
		if !transient || time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// parallel calls create(0..n-1) from 16 goroutines, retrying transient
// errors; the first other error fails t.
func parallel(t *testing.T, n int, create func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	next := make(chan int)
	errs := make(chan error, 1)
	for range 16 {
		wg.Go(func() {
			for i := range next {
				deadline := time.Now().Add(2 * time.Minute)
				for {
					err := create(i)
					if err == nil || apierrors.IsAlreadyExists(err) {
						break
					}
					transient := apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err) ||
						apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err)
					if !transient || time.Now().After(deadline) {
						select {
						case errs <- fmt.Errorf("object %d: %w", i, err):
						default:
						}
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
}

// waitRemote waits until the agent reports its remote endpoints synced
// and at least want remote rows in its ipcache (GET /v1/ipcache).
func waitRemote(t *testing.T, socket string, want int) {
	t.Helper()
	c := client.New(socket)
	defer c.Close()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		st, err := c.Status(context.Background())
		rows := 0
		if err == nil && st.K8s != nil && st.K8s.RemoteEndpointsSynced {
			rows = remoteRows(t, c)
			if rows >= want {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("remote endpoints: %d in the ipcache after 5 minutes, want %d (status error %v)", rows, want, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// remoteRows counts the ipcache rows of the remote endpoints' addresses
// (10.64.0.0/10) with one of their identities: claims the agent believed.
func remoteRows(t *testing.T, c *client.Client) int {
	t.Helper()
	rows, err := c.IPCache(context.Background())
	if err != nil {
		return 0
	}
	remote := netip.MustParsePrefix("10.64.0.0/10")
	n := 0
	for _, r := range rows {
		p, err := netip.ParsePrefix(r.CIDR)
		if err == nil && remote.Contains(p.Addr()) && r.Identity >= firstRemoteID && r.Identity < firstRemoteID+remoteIdentities {
			n++
		}
	}
	return n
}

// forward makes the API server reachable from the node's netns at the
// same loopback address (its certificate's): a listener there, each
// connection copied to and from a connection the test's netns dials.
func forward(t *testing.T, ns *testutil.NS, hostPort string) {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() (err error) {
		ln, err = net.Listen("tcp", hostPort)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.DialTimeout("tcp", hostPort, 5*time.Second)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(up, c); up.Close() })
			wg.Go(func() { _, _ = io.Copy(c, up); c.Close() })
		}
	})
}
