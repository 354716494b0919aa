package k8s

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// ErrInvalidConfig is wrapped by Config validation errors, which name the
// bad field by its flag.
var ErrInvalidConfig = errors.New("invalid k8s config")

// Config configures the Kubernetes mode.
type Config struct {
	// Kubeconfig is a kubeconfig file (--k8s-kubeconfig); "" with
	// InCluster uses the pod's service account.
	Kubeconfig string
	// InCluster uses the in-cluster configuration (--k8s, or
	// KUBERNETES_SERVICE_HOST set and no --k8s-kubeconfig).
	InCluster bool
	// APIServer (--k8s-api-server, "https://host:port") is where the API
	// server is reached, instead of the kubeconfig's server or, in
	// cluster, the kubernetes Service's ClusterIP: a kube-proxy-free
	// cluster has nothing that translates that address before the agent
	// runs (Cilium's k8sServiceHost).
	APIServer string
	// ServiceAccountDir holds the in-cluster token and CA (default
	// /var/run/secrets/kubernetes.io/serviceaccount).
	ServiceAccountDir string
	// NodeName is this node's name (--node-name): the agent watches the
	// pods whose spec.nodeName it is.
	NodeName string
	// SyncTimeout bounds the wait for the caches at start (default 2 min);
	// the agent then serves anyway and keeps syncing.
	SyncTimeout time.Duration
	// PodWait bounds how long a CNI ADD waits for its pod to be cached
	// (default 10 s) before the endpoint gets the init identity.
	PodWait time.Duration
	// PolicyAPIGroups are the API groups whose network policy kinds the
	// agent reads besides NetworkPolicy (--policy-api-groups):
	// "membrane.io" (MembraneNetworkPolicy and
	// MembraneClusterwideNetworkPolicy) and "cilium.io"
	// (CiliumNetworkPolicy and CiliumClusterwideNetworkPolicy, cilium.io/v2,
	// for clusters migrating from Cilium). Empty: membrane.io.
	PolicyAPIGroups []string
	// Labels are the operator's identity-relevant label patterns
	// (--labels, Cilium's syntax: "[source:][!]regexp"), applied after
	// labels.DefaultFilterPatterns to the labels derived from a pod.
	Labels []string
	// KubeProxyReplacement (--kube-proxy-replacement) translates NodePort
	// and external addresses too; without it kube-proxy serves those and
	// the agent translates cluster addresses only (at the pod's veth,
	// before kube-proxy's rules could see them).
	KubeProxyReplacement bool
	// HealthCheckNodePorts serves, with KubeProxyReplacement, each
	// externalTrafficPolicy Local Service's healthCheckNodePort (200 with
	// its local endpoints, 503 without), as kube-proxy does; listeners
	// come from HealthCheckListen (nil: net.Listen, the agent's netns).
	HealthCheckNodePorts bool
	HealthCheckListen    func(network, addr string) (net.Listener, error)
	// ProbeInterval is how often the agent asks the API server's /readyz
	// to report the connection state (default 5 s).
	ProbeInterval time.Duration
	// Workers is how many changes are applied at once (default 4; one
	// object's changes are never applied concurrently).
	Workers int
	// ClientQPS and ClientBurst (--k8s-client-qps, --k8s-client-burst,
	// Cilium's flags and defaults: 10 and 20) rate-limit the agent's
	// clients of the API server; client-go's own default, 5 and 10,
	// applies where a kubeconfig or the in-cluster config leaves them 0.
	// The MembraneEndpoint writer has its own, lower limit (epWriteQPS).
	ClientQPS   float64
	ClientBurst int
	// REST, when set, is used as is (tests).
	REST *rest.Config
	// PodCIDRWait bounds the wait at start for this node's Node object
	// to have spec.podCIDRs (--ipam kubernetes; default 2 min).
	PodCIDRWait time.Duration
	// PodCIDRs are the IPAM ranges taken from this node's Node object
	// (--ipam kubernetes; nil otherwise): a later change of the Node's
	// spec.podCIDRs is logged and reported in the status, not applied.
	PodCIDRs []netip.Prefix
	// Nodes receives the other nodes (addresses, pod CIDRs) after each
	// change; nil: they are only counted in the status.
	Nodes NodeSink
	// Secrets receives the values of the header secrets (the Secrets of
	// the actors' Config.PolicySecretsNamespace, the only namespace whose
	// Secrets the agent watches) after each change; nil, or no such
	// namespace: Secrets are not watched.
	Secrets SecretSink
	// Identity configures cluster-wide identities (identity.go).
	Identity IdentityConfig
}

// syncTimeout is SyncTimeout or its default.
func (c *Config) syncTimeout() time.Duration {
	if c.SyncTimeout == 0 {
		return 2 * time.Minute
	}
	return c.SyncTimeout
}

// Validate names the bad field by its flag.
func (c *Config) Validate() error {
	if errs := validation.IsDNS1123Subdomain(c.NodeName); len(errs) > 0 {
		return fmt.Errorf("--node-name: %q: %s: %w", c.NodeName, errs[0], ErrInvalidConfig)
	}
	if c.APIServer != "" {
		if err := validateAPIServer(c.APIServer); err != nil {
			return err
		}
	}
	if c.REST == nil && c.Kubeconfig == "" && !c.InCluster {
		return fmt.Errorf("--k8s-kubeconfig: empty path and not in a cluster: %w", ErrInvalidConfig)
	}
	if c.Kubeconfig != "" {
		if _, err := os.Stat(c.Kubeconfig); err != nil {
			return fmt.Errorf("--k8s-kubeconfig: %w", err)
		}
	}
	if _, err := labels.NewFilter(c.Labels); err != nil {
		return fmt.Errorf("--labels: %w: %w", err, ErrInvalidConfig)
	}
	if c.SyncTimeout < 0 || c.PodWait < 0 || c.PodCIDRWait < 0 || c.ProbeInterval < 0 || c.Workers < 0 {
		return fmt.Errorf("SyncTimeout, PodWait, PodCIDRWait, ProbeInterval, Workers: negative: %w", ErrInvalidConfig)
	}
	if c.ClientQPS < 0 || c.ClientBurst < 0 || (c.ClientQPS > 0 && c.ClientBurst < 1) {
		return fmt.Errorf("--k8s-client-qps %v, --k8s-client-burst %d: negative, or a rate without a burst: %w", c.ClientQPS, c.ClientBurst,
			ErrInvalidConfig)
	}
	return c.Identity.validate()
}

// clientset validates the config and returns the agent's client of the
// API server (its user agent names the node) and the configuration it
// was made from; what names the caller in errors.
func (c *Config) clientset(what string) (*rest.Config, *kubernetes.Clientset, error) {
	if err := c.Validate(); err != nil {
		return nil, nil, err
	}
	rc, err := c.restConfig()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	rc.UserAgent = "membrane-agent/" + c.NodeName
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	return rc, cs, nil
}

// DefaultServiceAccountDir is where a pod's service account token and
// the cluster's CA are mounted.
const DefaultServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// validateAPIServer accepts an https URL of a host and port, nothing else.
func validateAPIServer(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return fmt.Errorf("--k8s-api-server: %q: %v: %w", s, err, ErrInvalidConfig)
	case u.Scheme != "https" || u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "":
		return fmt.Errorf("--k8s-api-server: %q: want https://host:port: %w", s, ErrInvalidConfig)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || host == "" {
		return fmt.Errorf("--k8s-api-server: %q: want https://host:port: %w", s, ErrInvalidConfig)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("--k8s-api-server: %q: bad port: %w", s, ErrInvalidConfig)
	}
	return nil
}

// DefaultClientQPS and DefaultClientBurst are --k8s-client-qps and
// --k8s-client-burst's defaults (Cilium's).
const (
	DefaultClientQPS   = 10
	DefaultClientBurst = 20
)

func (c *Config) restConfig() (*rest.Config, error) {
	rc, err := c.baseRESTConfig()
	if err != nil || c.REST != nil {
		return rc, err
	}
	if c.ClientQPS > 0 {
		rc.QPS, rc.Burst = float32(c.ClientQPS), c.ClientBurst
	}
	return rc, nil
}

// baseRESTConfig is the configuration the flags name, before the rate
// limits.
func (c *Config) baseRESTConfig() (*rest.Config, error) {
	switch {
	case c.REST != nil:
		return rest.CopyConfig(c.REST), nil
	case c.Kubeconfig != "":
		rc, err := clientcmd.BuildConfigFromFlags(c.APIServer, c.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", c.Kubeconfig, err)
		}
		return rc, nil
	case c.APIServer != "":
		// In cluster, at the given address: the pod's service account,
		// with the token file re-read as the kubelet rotates it.
		dir := c.ServiceAccountDir
		if dir == "" {
			dir = DefaultServiceAccountDir
		}
		tokenFile, caFile := filepath.Join(dir, "token"), filepath.Join(dir, "ca.crt")
		for _, f := range []string{tokenFile, caFile} {
			if _, err := os.Stat(f); err != nil {
				return nil, fmt.Errorf("in-cluster config at --k8s-api-server %s: %w", c.APIServer, err)
			}
		}
		return &rest.Config{Host: c.APIServer, BearerTokenFile: tokenFile, TLSClientConfig: rest.TLSClientConfig{CAFile: caFile}}, nil
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("in-cluster config: %w", err)
	}
	return rc, nil
}

// APIServerURL is the URL the agent's client dials (the kubeconfig's
// server, --k8s-api-server, or the in-cluster one).
func (c *Config) APIServerURL() (string, error) {
	rc, err := c.restConfig()
	if err != nil {
		return "", fmt.Errorf("api server url: %w", err)
	}
	return rc.Host, nil
}
