package k8s

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/membrane-cni/membrane/test/kubetest"
)

// TestAPIServerFlagUsesServiceAccount: with --k8s-api-server the agent
// reaches the API server at that address (not KUBERNETES_SERVICE_HOST,
// unset here) as its pod's service account: the token and CA from the
// service account directory, the token re-read from its file. The real
// API server says who the client is.
func TestAPIServerFlagUsesServiceAccount(t *testing.T) {
	env := kubetest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(env.Config)
	const ns, sa = "default", "membrane-apiserver-flag"
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.CoreV1().ServiceAccounts(ns).Delete(context.Background(), sa, metav1.DeleteOptions{})
	})
	tok, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(tok.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), env.Config.TLSClientConfig.CAData, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	c := Config{InCluster: true, NodeName: "n1", APIServer: env.Config.Host, ServiceAccountDir: dir}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	rc, err := c.restConfig()
	if err != nil {
		t.Fatal(err)
	}
	if rc.Host != env.Config.Host || rc.BearerTokenFile != filepath.Join(dir, "token") {
		t.Fatalf("rest config host %q token file %q", rc.Host, rc.BearerTokenFile)
	}
	if rc.QPS != 0 || rc.Burst != 0 {
		t.Fatalf("rest config without --k8s-client-qps: QPS %v burst %d, want client-go's defaults (0)", rc.QPS, rc.Burst)
	}
	c.ClientQPS, c.ClientBurst = 10, 20
	if rc, err = c.restConfig(); err != nil || rc.QPS != 10 || rc.Burst != 20 {
		t.Fatalf("rest config with --k8s-client-qps 10 --k8s-client-burst 20: QPS %v burst %d (%v)", rc.QPS, rc.Burst, err)
	}
	// The identity backend's client keeps its own limit whatever the
	// agent's is: a burst of new label sets must not wait on it.
	if irc, err := c.identityRESTConfig(); err != nil || irc.QPS != identityQPS || irc.Burst != identityBurst || irc.Host != rc.Host {
		t.Fatalf("identity backend's rest config: QPS %v burst %d host %q (%v), want %v, %d, %q", irc.QPS, irc.Burst, irc.Host, err, identityQPS, identityBurst, rc.Host)
	}
	if rc.QPS != 10 || rc.Burst != 20 {
		t.Fatalf("the agent's rest config changed by the identity backend's: QPS %v burst %d", rc.QPS, rc.Burst)
	}
	for _, bad := range [][2]float64{{-1, 20}, {10, 0}, {10, -1}} {
		b := c
		b.ClientQPS, b.ClientBurst = bad[0], int(bad[1])
		if err := b.Validate(); err == nil {
			t.Errorf("--k8s-client-qps %v --k8s-client-burst %v accepted", bad[0], bad[1])
		}
	}
	review, err := kubernetes.NewForConfigOrDie(rc).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := review.Status.UserInfo.Username, "system:serviceaccount:"+ns+":"+sa; got != want {
		t.Fatalf("the API server saw %q, want %q", got, want)
	}

	// A directory without the token is refused before any connection.
	c.ServiceAccountDir = t.TempDir()
	if _, err := c.restConfig(); err == nil {
		t.Fatal("a service account directory without a token was accepted")
	}
}
