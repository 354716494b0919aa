package l7

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/k8s"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
)

const (
	secretsNode = "secrets-node"
	secretsNS   = "membrane-secrets"
)

// secretPolicies: b admits a on port 80 only with X-Token holding the
// Secret membrane-secrets/api-token; the second (the attack) names
// kube-system's Secret for port 8080.
const secretPolicies = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: b-secret, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: b}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: a}}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
      rules: {http: [{headerMatches: [{name: X-Token, secret: {namespace: membrane-secrets, name: api-token}}]}]}
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: b-attack, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: b}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: a}}]
    toPorts:
    - ports: [{port: "8080", protocol: TCP}]
      rules: {http: [{headerMatches: [{name: X-Token, secret: {namespace: kube-system, name: admin-token}}]}]}
`

// auditPolicy records every request on Secrets (who, verb, namespace).
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  resources: [{group: "", resources: [secrets]}]
- level: None
`

// TestHeaderSecretKubernetes: a CiliumNetworkPolicy from a real API
// server whose headerMatch names a Secret of the policy secrets
// namespace, enforced by the real proxy on real traffic between pods on
// the Linux datapath: the Secret's value passes, others and none are
// refused (403); the Secret rotated, the old value is refused and the
// new one passes (no restart); the Secret deleted, the match fails. A
// policy naming kube-system's Secret is refused (a Warning Event naming
// the field and the namespace) and, as the API server's audit log shows,
// the agent never reads a Secret outside its namespace: it lists and
// watches that namespace only.
func TestHeaderSecretKubernetes(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	policyFile, auditLog := filepath.Join(dir, "audit-policy.yaml"), filepath.Join(dir, "audit.log")
	if err := os.WriteFile(policyFile, []byte(auditPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	env := kubetest.StartOwn(t, "--audit-policy-file="+policyFile, "--audit-log-path="+auditLog, "--audit-log-mode=blocking")
	env.InstallCRDs(t)
	env.InstallCiliumCRDs(t)
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: secretsNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	putSecret(t, cs, "kube-system", "admin-token", "kube-system-value")
	putSecret(t, cs, secretsNS, "api-token", "tok-one-3f9a")
	for _, name := range []string{"a", "b"} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{"app": name}},
			Spec: corev1.PodSpec{NodeName: secretsNode, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause"}}}}
		if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	n := newNode(t, "10.244.83.0/24", nodeOpts{pods: []string{}, agent: func(cfg *agent.Config) {
		cfg.K8s = &k8s.Config{Kubeconfig: env.Kubeconfig, NodeName: secretsNode, PodWait: 30 * time.Second, SyncTimeout: time.Minute,
			Identity: k8s.IdentityConfig{Mode: k8s.IdentityLocal}, PolicyAPIGroups: []string{"membrane.io", "cilium.io"}}
		cfg.NodeName = secretsNode
		cfg.Actors.PolicySecretsNamespace = secretsNS
	}})
	a, b := n.addKubePod("a"), n.addKubePod("b")
	httpServer(t, b)

	objs, err := kubetest.ReadObjects([]byte(secretPolicies))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubetest.Apply(ctx, env.Config, kubetest.FieldManager, objs); err != nil {
		t.Fatal(err)
	}
	status := func(token string) int {
		code, _, err := a.requestHeader(b, "/", token, dropTimeout)
		if err != nil {
			return 0
		}
		return code
	}
	// Before the policy is in force b admits everything: wait for a
	// refusal first.
	testutil.Eventually(t, "b's L7 policy in force", func() bool { return status("") == 403 })
	testutil.Eventually(t, "the secret's value admitted", func() bool { return status("tok-one-3f9a") == 200 })
	for _, tok := range []string{"", "tok-two-7c1e", "kube-system-value"} {
		if got := status(tok); got != 403 {
			t.Errorf("X-Token %q: %d, want 403", tok, got)
		}
	}

	putSecret(t, cs, secretsNS, "api-token", "tok-two-7c1e")
	testutil.Eventually(t, "the rotated secret admitted", func() bool { return status("tok-two-7c1e") == 200 })
	if got := status("tok-one-3f9a"); got != 403 {
		t.Errorf("rotated: the old value: %d, want 403", got)
	}

	if err := cs.CoreV1().Secrets(secretsNS).Delete(ctx, "api-token", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the deleted secret's match failing", func() bool { return status("tok-two-7c1e") == 403 })

	// The attack: refused, reported, never read.
	testutil.Eventually(t, "b-attack reported refused", func() bool {
		evs, err := cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		return slices.ContainsFunc(evs.Items, func(e corev1.Event) bool {
			return e.InvolvedObject.Name == "b-attack" && e.Reason == "PolicyPartiallyRefused" &&
				strings.Contains(e.Message, "secret kube-system/admin-token is outside the policy secrets namespace")
		})
	})
	if code, _, err := a.requestHeader(b, "/", "kube-system-value", dropTimeout); err == nil && code == 200 {
		t.Error("a -> b:80 with kube-system's value admitted")
	}
	// The test and the agent share the admin's credentials (the API
	// server's own caches are system:apiserver's); the test only writes.
	watched := false
	for _, r := range secretReads(t, auditLog) {
		if r.User.Username == "system:apiserver" {
			continue
		}
		watched = watched || (r.ObjectRef.Namespace == secretsNS && (r.Verb == "list" || r.Verb == "watch"))
		if r.ObjectRef.Namespace != secretsNS && r.Verb != "create" && r.Verb != "update" && r.Verb != "delete" {
			t.Errorf("the API server saw %s %s (namespace %q, user %s): the agent reads Secrets of %s only", r.Verb, r.RequestURI, r.ObjectRef.Namespace, r.User.Username, secretsNS)
		}
	}
	if !watched {
		t.Errorf("the audit log holds no list or watch of %s's Secrets: it does not show the agent's reads", secretsNS)
	}
	// The values never reach the agent's logs or API: the endpoint's
	// policy names the secret.
	pol, err := n.c.EndpointPolicy(context.Background(), fmt.Sprint(b.ep.ID))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(pol)
	if !strings.Contains(string(raw), `"secret":"secret membrane-secrets/api-token"`) || strings.Contains(string(raw), "tok-") {
		t.Errorf("b's policy: %s", raw)
	}
	if log := n.node.Logs.String(); strings.Contains(log, "tok-") || strings.Contains(log, "kube-system-value") {
		t.Error("a secret's value in the agent's (or proxy's) log")
	}
	n.mu.Lock()
	evs, _ := json.Marshal(n.events)
	n.mu.Unlock()
	if strings.Contains(string(evs), "tok-") {
		t.Error("a secret's value in the event stream")
	}
}

// putSecret creates or replaces ns/name with one entry holding value.
func putSecret(t *testing.T, cs kubernetes.Interface, ns, name, value string) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string][]byte{"token": []byte(value)}}
	ctx := context.Background()
	if _, err := cs.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); apierrors.IsNotFound(err) {
		_, err = cs.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
}

// auditEvent is what the test reads of an audit log line.
type auditEvent struct {
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef struct {
		Namespace string `json:"namespace"`
	} `json:"objectRef"`
}

// secretReads returns the Secret requests of the audit log (the audit
// policy logs no other resource).
func secretReads(t *testing.T, path string) []auditEvent {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []auditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e auditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("audit log: %v", err)
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		t.Fatal("audit log empty: the audit policy records no Secret request")
	}
	return out
}

// addKubePod adds pod default/name (its Pod object made by the test) and
// waits until the agent labelled its endpoint from the object.
func (n *node) addKubePod(name string) *pod {
	n.t.Helper()
	hp := n.node.NewPod(name)
	n.node.MustAdd(hp)
	p := &pod{name: name, ns: hp.NS, hp: hp, ip: hp.IPv4}
	n.pods[name] = p
	n.t.Cleanup(func() {
		if p.hp != nil {
			if err := n.delPod(p); err != nil {
				n.t.Errorf("DEL %s: %v", name, err)
			}
		}
	})
	testutil.Eventually(n.t, "pod "+name+" labelled from its object", func() bool {
		ep, err := n.c.EndpointGet(context.Background(), "container-id:"+hp.RT.ContainerID)
		if err != nil {
			return false
		}
		p.ep = ep
		return slices.Contains(ep.Labels, "k8s:app="+name)
	})
	return p
}

// requestHeader sends GET path to dst:80 from p with X-Token: token
// (none when empty).
func (p *pod) requestHeader(dst *pod, path, token string, timeout time.Duration) (int, string, error) {
	req, err := http.NewRequest("GET", "http://"+netip.AddrPortFrom(dst.ip, 80).String()+path, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("X-Token", token)
	}
	resp, err := p.client(timeout, false).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}
