package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// Check results.
const (
	Pass = "pass"
	Fail = "fail"
	Skip = "skip"
)

// managedBy labels what the connectivity test creates; a namespace
// without it is never reused or deleted.
const (
	managedByKey   = "app.kubernetes.io/managed-by"
	managedByValue = "membranectl-connectivity-test"
	echoPort       = 8080
)

// curl's exit codes for a connection that did not open.
const (
	curlCouldNotConnect = 7
	curlTimedOut        = 28
)

// ConnectivityOptions configure a connectivity test run.
type ConnectivityOptions struct {
	// Namespace is created for the test and deleted after it; an
	// existing namespace is reused only if an earlier run made it.
	Namespace string
	// Image runs the test's pods: upstream's agnhost (netexec serves
	// HTTP; the image has curl).
	Image      string
	PullPolicy corev1.PullPolicy
	// External is a host:port outside the cluster the pods should reach
	// (pod to world); empty skips that check.
	External string
	// CheckTimeout bounds one check's retries (a policy takes effect
	// within it); ReadyTimeout the pods' start.
	CheckTimeout, ReadyTimeout time.Duration
	// Keep leaves the namespace for inspection.
	Keep bool
	// Agents locate the agent pods (the L7 check asks the server's
	// agent whether its L7 proxy runs).
	Agents Agents
	// Log receives progress lines (nil: none).
	Log func(format string, args ...any)
}

// DefaultConnectivityOptions are membranectl's defaults.
func DefaultConnectivityOptions() ConnectivityOptions {
	return ConnectivityOptions{Namespace: "membrane-connectivity-test", Image: "registry.k8s.io/e2e-test-images/agnhost:2.59",
		PullPolicy: corev1.PullIfNotPresent, CheckTimeout: 30 * time.Second, ReadyTimeout: 3 * time.Minute, Agents: DefaultAgents()}
}

// Validate checks the options before anything is created.
func (o *ConnectivityOptions) Validate() error {
	if errs := validation.IsDNS1123Label(o.Namespace); len(errs) > 0 {
		return fmt.Errorf("namespace %q: %s", o.Namespace, strings.Join(errs, "; "))
	}
	if strings.TrimSpace(o.Image) == "" || strings.ContainsAny(o.Image, " \t\n") {
		return fmt.Errorf("image %q: want an image reference", o.Image)
	}
	switch o.PullPolicy {
	case corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		return fmt.Errorf("pull policy %q: want Always, IfNotPresent or Never", o.PullPolicy)
	}
	if o.External != "" {
		host, port, err := net.SplitHostPort(o.External)
		if err != nil {
			return fmt.Errorf("external target %q: %w", o.External, err)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return fmt.Errorf("external target %q: port %q: want 1..65535", o.External, port)
		}
		if _, err := netip.ParseAddr(host); err != nil && len(validation.IsDNS1123Subdomain(host)) > 0 {
			return fmt.Errorf("external target %q: host %q is neither an address nor a DNS name", o.External, host)
		}
	}
	if o.CheckTimeout < time.Second || o.CheckTimeout > 10*time.Minute {
		return fmt.Errorf("check timeout %s: want 1s..10m", o.CheckTimeout)
	}
	if o.ReadyTimeout < 10*time.Second || o.ReadyTimeout > 30*time.Minute {
		return fmt.Errorf("ready timeout %s: want 10s..30m", o.ReadyTimeout)
	}
	return nil
}

// CheckResult is one check's outcome.
type CheckResult struct {
	Name   string        `json:"name"`
	Result string        `json:"result"` // pass, fail or skip
	Detail string        `json:"detail,omitempty"`
	Took   time.Duration `json:"took-ns"`
}

// ConnectivityReport is a whole run.
type ConnectivityReport struct {
	Namespace string        `json:"namespace"`
	Nodes     []string      `json:"nodes"`
	Checks    []CheckResult `json:"checks"`
	Passed    int           `json:"passed"`
	Failed    int           `json:"failed"`
	Skipped   int           `json:"skipped"`
	// Cleanup is why removing the namespace failed, if it did.
	Cleanup string `json:"cleanup-error,omitempty"`
}

// OK says every check passed or was skipped and cleanup worked.
func (r *ConnectivityReport) OK() bool { return r.Failed == 0 && r.Cleanup == "" }

// connRun is one run's state.
type connRun struct {
	c      *Client
	o      ConnectivityOptions
	dyn    dynamic.Interface
	rep    *ConnectivityReport
	nodes  []corev1.Node
	pods   map[string]*corev1.Pod
	svcIP  string
	logf   func(string, ...any)
	nodeOf map[string]string // pod name -> node name
}

// RunConnectivity deploys the test's pods into o.Namespace and runs the
// checks: pod to pod on the same and another node, pod to Service (by
// address and by DNS name), pod to its own and another host, pod to an
// outside target, a NetworkPolicy's deny and allow, and an L7 rule's
// allow and deny. It removes the namespace afterwards unless o.Keep. An
// error means the run could not be set up; failed checks are in the
// report.
func (c *Client) RunConnectivity(ctx context.Context, o ConnectivityOptions) (*ConnectivityReport, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	r := &connRun{c: c, o: o, dyn: dyn, rep: &ConnectivityReport{Namespace: o.Namespace}, pods: map[string]*corev1.Pod{},
		nodeOf: map[string]string{}, logf: o.Log}
	if r.logf == nil {
		r.logf = func(string, ...any) {}
	}
	if err := r.setup(ctx); err != nil {
		r.cleanup()
		return r.rep, err
	}
	r.checks(ctx)
	r.cleanup()
	return r.rep, nil
}

func (r *connRun) setup(ctx context.Context) error {
	kc := r.c.Kube
	nodes, err := kc.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	for _, n := range nodes.Items {
		if nodeSchedulable(&n) {
			r.nodes = append(r.nodes, n)
		}
	}
	if len(r.nodes) == 0 {
		return errors.New("no Ready, schedulable node without NoSchedule taints")
	}
	slices.SortFunc(r.nodes, func(a, b corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	if len(r.nodes) > 2 {
		r.nodes = r.nodes[:2]
	}
	for _, n := range r.nodes {
		r.rep.Nodes = append(r.rep.Nodes, n.Name)
	}
	if err := r.namespace(ctx); err != nil {
		return err
	}
	a := r.nodes[0].Name
	specs := []*corev1.Pod{
		r.echoPod("echo-a", a),
		r.clientPod("client", a, nil),
		r.clientPod("client-allowed", a, map[string]string{"connectivity-role": "allowed"}),
	}
	if len(r.nodes) > 1 {
		specs = append(specs, r.echoPod("echo-b", r.nodes[1].Name))
	}
	for _, p := range specs {
		if _, err := kc.CoreV1().Pods(r.o.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create pod %s: %w", p.Name, err)
		}
		r.nodeOf[p.Name] = p.Spec.NodeName
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Labels: managed()},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "echo"},
			Ports: []corev1.ServicePort{{Name: "http", Port: echoPort, TargetPort: intstr.FromInt32(echoPort), Protocol: corev1.ProtocolTCP}}},
	}
	got, err := kc.CoreV1().Services(r.o.Namespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create service: %w", err)
	}
	r.svcIP = got.Spec.ClusterIP
	r.logf("waiting for %d pods on %s", len(specs), strings.Join(r.rep.Nodes, ", "))
	deadline := time.Now().Add(r.o.ReadyTimeout)
	for _, p := range specs {
		for {
			cur, err := kc.CoreV1().Pods(r.o.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if err == nil && podReady(cur) && cur.Status.PodIP != "" {
				r.pods[p.Name] = cur
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("pod %s not ready within %s: %s", p.Name, r.o.ReadyTimeout, podProblem(cur, err))
			}
			if err := sleep(ctx, 500*time.Millisecond); err != nil {
				return err
			}
		}
	}
	return nil
}

// namespace creates the test's namespace, first removing one an earlier
// run left (never a namespace it did not make).
func (r *connRun) namespace(ctx context.Context) error {
	nsc := r.c.Kube.CoreV1().Namespaces()
	if old, err := nsc.Get(ctx, r.o.Namespace, metav1.GetOptions{}); err == nil {
		if old.Labels[managedByKey] != managedByValue {
			return fmt.Errorf("namespace %s exists and was not made by the connectivity test (no %s=%s label): choose another with --namespace",
				r.o.Namespace, managedByKey, managedByValue)
		}
		r.logf("removing namespace %s left by an earlier run", r.o.Namespace)
		if err := r.deleteNamespace(ctx); err != nil {
			return err
		}
	} else if !apierrors.IsNotFound(err) {
		return fmt.Errorf("get namespace %s: %w", r.o.Namespace, err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.o.Namespace, Labels: managed()}}
	if _, err := nsc.Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", r.o.Namespace, err)
	}
	return nil
}

func (r *connRun) deleteNamespace(ctx context.Context) error {
	nsc := r.c.Kube.CoreV1().Namespaces()
	if err := nsc.Delete(ctx, r.o.Namespace, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete namespace %s: %w", r.o.Namespace, err)
	}
	deadline := time.Now().Add(r.o.ReadyTimeout)
	for {
		_, err := nsc.Get(ctx, r.o.Namespace, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("namespace %s still there %s after its deletion (%v)", r.o.Namespace, r.o.ReadyTimeout, err)
		}
		if err := sleep(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}

// cleanup removes the namespace (unless Keep) with its own deadline, so
// an interrupted run still cleans up.
func (r *connRun) cleanup() {
	if r.o.Keep {
		r.logf("namespace %s kept (--keep)", r.o.Namespace)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.o.ReadyTimeout)
	defer cancel()
	r.logf("removing namespace %s", r.o.Namespace)
	if err := r.deleteNamespace(ctx); err != nil {
		r.rep.Cleanup = err.Error()
	}
}

func managed() map[string]string { return map[string]string{managedByKey: managedByValue} }

func (r *connRun) basePod(name, node string, labels map[string]string, args []string) *corev1.Pod {
	l := managed()
	l["name"] = name
	for k, v := range labels {
		l[k] = v
	}
	grace := int64(1)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: &grace,
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Containers: []corev1.Container{{
				Name: "main", Image: r.o.Image, ImagePullPolicy: r.o.PullPolicy, Args: args,
			}},
		},
	}
}

func (r *connRun) echoPod(name, node string) *corev1.Pod {
	p := r.basePod(name, node, map[string]string{"app": "echo"}, []string{"netexec", "--http-port=" + strconv.Itoa(echoPort), "--udp-port=-1"})
	p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: echoPort}}
	p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
		TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(echoPort)}}, PeriodSeconds: 1}
	return p
}

func (r *connRun) clientPod(name, node string, labels map[string]string) *corev1.Pod {
	return r.basePod(name, node, labels, []string{"pause"})
}

// checks runs every check in order; each records its result.
func (r *connRun) checks(ctx context.Context) {
	a := r.pods["echo-a"]
	r.run(ctx, "pod-to-pod/same-node", func(ctx context.Context) (string, string) {
		return r.expectHTTP(ctx, "client", httpURL(a.Status.PodIP, "/hostname"), "echo-a")
	})
	r.run(ctx, "pod-to-pod/other-node", func(ctx context.Context) (string, string) {
		b := r.pods["echo-b"]
		if b == nil {
			return Skip, "one schedulable node"
		}
		return r.expectHTTP(ctx, "client", httpURL(b.Status.PodIP, "/hostname"), "echo-b")
	})
	r.run(ctx, "pod-to-service/cluster-ip", func(ctx context.Context) (string, string) {
		if r.svcIP == "" || r.svcIP == corev1.ClusterIPNone {
			return Fail, "the Service has no cluster IP"
		}
		return r.expectHTTP(ctx, "client", httpURL(r.svcIP, "/hostname"), "echo-")
	})
	r.run(ctx, "dns/service-name", func(ctx context.Context) (string, string) {
		return r.expectHTTP(ctx, "client", "http://echo."+r.o.Namespace+":"+strconv.Itoa(echoPort)+"/hostname", "echo-")
	})
	for i, n := range r.nodes {
		name := "pod-to-host/same-node"
		if i > 0 {
			name = "pod-to-host/other-node"
		}
		r.run(ctx, name, func(ctx context.Context) (string, string) {
			addr := nodeInternalIP(&n)
			if addr == "" {
				return Fail, "node " + n.Name + " has no InternalIP"
			}
			port := int(n.Status.DaemonEndpoints.KubeletEndpoint.Port)
			if port == 0 {
				port = 10250
			}
			return r.expectConnect(ctx, "client", net.JoinHostPort(addr, strconv.Itoa(port)), true)
		})
	}
	if len(r.nodes) == 1 {
		r.rep.Checks = append(r.rep.Checks, CheckResult{Name: "pod-to-host/other-node", Result: Skip, Detail: "one schedulable node"})
		r.rep.Skipped++
	}
	r.run(ctx, "pod-to-world", func(ctx context.Context) (string, string) {
		if r.o.External == "" {
			return Skip, "no outside target given (--external-target host:port)"
		}
		return r.expectConnect(ctx, "client", r.o.External, true)
	})
	r.networkPolicy(ctx)
	r.l7Policy(ctx)
}

// run times one check and records it.
func (r *connRun) run(ctx context.Context, name string, fn func(context.Context) (string, string)) {
	t0 := time.Now()
	res, detail := fn(ctx)
	if ctx.Err() != nil && res != Pass {
		res, detail = Fail, "interrupted: "+ctx.Err().Error()
	}
	cr := CheckResult{Name: name, Result: res, Detail: detail, Took: time.Since(t0)}
	r.rep.Checks = append(r.rep.Checks, cr)
	switch res {
	case Pass:
		r.rep.Passed++
	case Fail:
		r.rep.Failed++
	default:
		r.rep.Skipped++
	}
	r.logf("%-32s %s %s", name, res, detail)
}

func httpURL(ip, path string) string {
	return "http://" + net.JoinHostPort(ip, strconv.Itoa(echoPort)) + path
}

// curl fetches url from a pod: the HTTP status and body, or an error
// (connection refused, timed out: curl's exit code and message).
func (r *connRun) curl(ctx context.Context, from, url string) (int, string, error) {
	cmd := []string{"curl", "-sS", "--max-time", "3", "--connect-timeout", "3", "-o", "-", "-w", "\n%{http_code}", url}
	out, err := r.c.Exec(ctx, r.o.Namespace, from, "main", cmd)
	if err != nil {
		return 0, "", err
	}
	s := strings.TrimRight(string(out), "\n")
	i := strings.LastIndexByte(s, '\n')
	code, cerr := strconv.Atoi(s[i+1:])
	if cerr != nil {
		return 0, "", fmt.Errorf("curl printed no status: %q", s)
	}
	return code, s[:max(i, 0)], nil
}

// expectHTTP retries until from's GET of url answers 200 with a body
// starting with want, within the check timeout.
func (r *connRun) expectHTTP(ctx context.Context, from, url, want string) (string, string) {
	var last string
	ok := r.retry(ctx, func(ctx context.Context) bool {
		code, body, err := r.curl(ctx, from, url)
		switch {
		case err != nil:
			last = err.Error()
		case code != 200:
			last = fmt.Sprintf("HTTP %d: %.80q", code, body)
		case !strings.HasPrefix(strings.TrimSpace(body), want):
			last = fmt.Sprintf("HTTP 200 with %.80q, want %q...", body, want)
		default:
			last = fmt.Sprintf("%s answered %s", url, strings.TrimSpace(body))
			return true
		}
		return false
	})
	if ok {
		return Pass, last
	}
	return Fail, fmt.Sprintf("%s from %s: %s", url, from, last)
}

// expectConnect retries until a TCP connection from the pod to addr
// opens (want) or fails (!want), within the check timeout.
func (r *connRun) expectConnect(ctx context.Context, from, addr string, want bool) (string, string) {
	var last string
	ok := r.retry(ctx, func(ctx context.Context) bool {
		_, err := r.c.Exec(ctx, r.o.Namespace, from, "main", []string{"/agnhost", "connect", addr, "--timeout=3s"})
		if (err == nil) == want {
			last = "connected to " + addr
			if !want {
				last = "refused as expected: " + shortErr(err)
			}
			return true
		}
		if err != nil {
			last = shortErr(err)
		} else {
			last = "connected, want refused"
		}
		return false
	})
	if ok {
		return Pass, last
	}
	return Fail, fmt.Sprintf("%s from %s: %s", addr, from, last)
}

// expectDenied retries until from's GET of url fails to connect (a
// policy drop: curl times out or the connection is refused).
func (r *connRun) expectDenied(ctx context.Context, from, url string) (string, string) {
	var last string
	ok := r.retry(ctx, func(ctx context.Context) bool {
		code, body, err := r.curl(ctx, from, url)
		switch ec := ExitCode(err); {
		case err == nil:
			last = fmt.Sprintf("HTTP %d %.40q: still reachable", code, body)
		case ec == curlCouldNotConnect || ec == curlTimedOut:
			last = "denied: " + shortErr(err)
			return true
		default: // the exec itself failed: not a verdict
			last = shortErr(err)
		}
		return false
	})
	if ok {
		return Pass, last
	}
	return Fail, fmt.Sprintf("%s from %s: %s", url, from, last)
}

// retry calls try until it reports success or the check timeout ends.
func (r *connRun) retry(ctx context.Context, try func(context.Context) bool) bool {
	ctx, cancel := context.WithTimeout(ctx, r.o.CheckTimeout)
	defer cancel()
	for {
		if try(ctx) {
			return true
		}
		if sleep(ctx, time.Second) != nil {
			return false
		}
	}
}

// networkPolicy: a NetworkPolicy admits only connectivity-role=allowed
// pods to echo-a; client is denied, client-allowed admitted; removing it
// opens echo-a again.
func (r *connRun) networkPolicy(ctx context.Context) {
	a := r.pods["echo-a"]
	url := httpURL(a.Status.PodIP, "/hostname")
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "echo-a-allowed-only", Labels: managed()},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"name": "echo-a"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"connectivity-role": "allowed"}}}},
			}},
		},
	}
	npc := r.c.Kube.NetworkingV1().NetworkPolicies(r.o.Namespace)
	if _, err := npc.Create(ctx, np, metav1.CreateOptions{}); err != nil {
		r.run(ctx, "network-policy/deny", func(context.Context) (string, string) { return Fail, "create NetworkPolicy: " + err.Error() })
		return
	}
	r.run(ctx, "network-policy/deny", func(ctx context.Context) (string, string) { return r.expectDenied(ctx, "client", url) })
	r.run(ctx, "network-policy/allow", func(ctx context.Context) (string, string) {
		return r.expectHTTP(ctx, "client-allowed", url, "echo-a")
	})
	if err := npc.Delete(ctx, np.Name, metav1.DeleteOptions{}); err != nil {
		r.run(ctx, "network-policy/removed", func(context.Context) (string, string) { return Fail, "delete NetworkPolicy: " + err.Error() })
		return
	}
	r.run(ctx, "network-policy/removed", func(ctx context.Context) (string, string) {
		return r.expectHTTP(ctx, "client", url, "echo-a")
	})
}

// membraneNetworkPolicies is the namespaced policy CRD.
var membraneNetworkPolicies = schema.GroupVersionResource{Group: "membrane.io", Version: "v2", Resource: "membranenetworkpolicies"}

// l7Policy: a MembraneNetworkPolicy with an HTTP rule on echo-a admits
// GET /hostname and answers 403 to GET /echo (through the L7 proxy).
// Skipped when echo-a's agent runs without the L7 proxy.
func (r *connRun) l7Policy(ctx context.Context) {
	node := r.nodeOf["echo-a"]
	if reason := r.l7Unavailable(ctx, node); reason != "" {
		for _, n := range []string{"l7-policy/allowed-path", "l7-policy/denied-path"} {
			r.run(ctx, n, func(context.Context) (string, string) { return Skip, reason })
		}
		return
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "membrane.io/v2", "kind": "MembraneNetworkPolicy",
		"metadata": map[string]any{"name": "echo-a-http", "labels": map[string]any{managedByKey: managedByValue}},
		"spec": map[string]any{
			"endpointSelector": map[string]any{"matchLabels": map[string]any{"name": "echo-a"}},
			"ingress": []any{map[string]any{
				"fromEndpoints": []any{map[string]any{}},
				"toPorts": []any{map[string]any{
					"ports": []any{map[string]any{"port": strconv.Itoa(echoPort), "protocol": "TCP"}},
					"rules": map[string]any{"http": []any{map[string]any{"method": "GET", "path": "/hostname"}}},
				}},
			}},
		},
	}}
	res := r.dyn.Resource(membraneNetworkPolicies).Namespace(r.o.Namespace)
	if _, err := res.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		r.run(ctx, "l7-policy/allowed-path", func(context.Context) (string, string) {
			return Fail, "create MembraneNetworkPolicy: " + err.Error()
		})
		return
	}
	a := r.pods["echo-a"]
	r.run(ctx, "l7-policy/denied-path", func(ctx context.Context) (string, string) {
		url := httpURL(a.Status.PodIP, "/echo?msg=l7")
		var last string
		ok := r.retry(ctx, func(ctx context.Context) bool {
			code, body, err := r.curl(ctx, "client", url)
			switch {
			case err != nil:
				last = shortErr(err)
			case code == 403:
				last = "HTTP 403 from the proxy"
				return true
			default:
				last = fmt.Sprintf("HTTP %d %.40q, want 403", code, body)
			}
			return false
		})
		if ok {
			return Pass, last
		}
		return Fail, url + ": " + last
	})
	r.run(ctx, "l7-policy/allowed-path", func(ctx context.Context) (string, string) {
		return r.expectHTTP(ctx, "client", httpURL(a.Status.PodIP, "/hostname"), "echo-a")
	})
	_ = res.Delete(ctx, "echo-a-http", metav1.DeleteOptions{})
}

// l7Unavailable asks the agent on node whether its L7 proxy runs: ""
// when it does, else why the L7 checks are skipped.
func (r *connRun) l7Unavailable(ctx context.Context, node string) string {
	pods, err := r.c.AgentPods(ctx, r.o.Agents)
	if err != nil {
		return "agent pods: " + err.Error()
	}
	for _, p := range pods {
		if p.Node != node {
			continue
		}
		var st models.Status
		if err := r.c.Ctl(ctx, r.o.Agents, p.Name, &st, "status"); st.State == "" {
			return fmt.Sprintf("agent on %s: %v", node, err)
		}
		if st.L7Proxy == nil {
			return "the agent on " + node + " runs without the L7 proxy (chart value l7Proxy=true enables it)"
		}
		return ""
	}
	return "no agent pod on " + node
}

func shortErr(err error) string {
	var ee *ExecError
	if errors.As(err, &ee) {
		if s := strings.TrimSpace(ee.Stderr); s != "" {
			return s
		}
		return ee.Err.Error()
	}
	return err.Error()
}

func nodeSchedulable(n *corev1.Node) bool {
	if n.Spec.Unschedulable {
		return false
	}
	for _, t := range n.Spec.Taints {
		if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
			return false
		}
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func nodeInternalIP(n *corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

func podProblem(p *corev1.Pod, err error) string {
	if err != nil {
		return err.Error()
	}
	if p == nil {
		return "not found"
	}
	msg := string(p.Status.Phase)
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			msg += fmt.Sprintf(", %s waiting: %s %s", cs.Name, w.Reason, w.Message)
		}
	}
	return msg
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
