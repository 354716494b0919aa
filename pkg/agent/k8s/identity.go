package k8s

import (
	"fmt"
	"log/slog"
	"time"

	"k8s.io/client-go/rest"

	"github.com/membrane-cni/membrane/pkg/agent/k8s/identitycrd"
)

// Identity allocation modes (--identity-allocation-mode).
const (
	// IdentityCRD numbers label sets cluster-wide through MembraneIdentity
	// objects (the default in Kubernetes mode).
	IdentityCRD = "crd"
	// IdentityLocal numbers them per node (standalone's allocator).
	IdentityLocal = "local"
)

// IdentityConfig configures the cluster-wide identities of the
// Kubernetes mode.
type IdentityConfig struct {
	// Mode is IdentityCRD ("" means it) or IdentityLocal.
	Mode string
	// GCGrace (--identity-gc-grace, default 15 min) is how long an
	// identity no node uses stays before it is deleted, and how long a
	// node's heartbeat may be late; GCInterval (--identity-gc-interval,
	// default 1 min, negative disables) is the time between passes.
	GCGrace, GCInterval time.Duration
	// LeaseNamespace holds the nodes' heartbeat leases (default
	// kube-system).
	LeaseNamespace string
}

func (c IdentityConfig) validate() error {
	switch c.Mode {
	case "", IdentityCRD, IdentityLocal:
	default:
		return fmt.Errorf("--identity-allocation-mode: %q: want crd or local: %w", c.Mode, ErrInvalidConfig)
	}
	if c.GCGrace < 0 {
		return fmt.Errorf("--identity-gc-grace: %v is negative: %w", c.GCGrace, ErrInvalidConfig)
	}
	return nil
}

// CRDIdentities reports whether identities come from MembraneIdentity
// objects.
func (c *Config) CRDIdentities() bool { return c.Identity.Mode != IdentityLocal }

// RESTConfig is the API server's client configuration.
func (c *Config) RESTConfig() (*rest.Config, error) { return c.restConfig() }

// identityQPS and identityBurst limit the MembraneIdentity backend's own
// client. A relabel of a pod to a label set no pod had is one create and
// one release; under the agent's shared limit (--k8s-client-qps 10,
// burst 20) a burst of 100 such relabels waited 5-10 s for its
// identities (make bench-k8s). The burst covers 100 of them at once; the
// rate keeps a sustained churn of new label sets modest.
const (
	identityQPS   = 20
	identityBurst = 200
)

// identityRESTConfig is the agent's client configuration with the
// identity backend's own limits.
func (c *Config) identityRESTConfig() (*rest.Config, error) {
	base, err := c.restConfig()
	if err != nil {
		return nil, err
	}
	rc := rest.CopyConfig(base)
	rc.QPS, rc.Burst = identityQPS, identityBurst
	return rc, nil
}

// NewIdentityBackend starts the MembraneIdentity backend for this node.
func NewIdentityBackend(c *Config, log *slog.Logger) (*identitycrd.Backend, error) {
	rc, err := c.identityRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("identity backend: %w", err)
	}
	b, err := identitycrd.New(rc, identitycrd.Config{Node: c.NodeName, LeaseNamespace: c.Identity.LeaseNamespace,
		GCGrace: c.Identity.GCGrace, GCInterval: c.Identity.GCInterval}, log)
	if err != nil {
		return nil, fmt.Errorf("identity backend: %w", err)
	}
	return b, nil
}
