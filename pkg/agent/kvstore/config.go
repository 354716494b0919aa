package kvstore

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// Sentinel errors.
var (
	// ErrInvalidConfig is wrapped by Config validation errors, which name
	// the bad field by its flag.
	ErrInvalidConfig = errors.New("invalid kvstore config")
	// ErrUnavailable is wrapped by operations that failed because etcd
	// could not be reached or this node holds no lease yet; they may be
	// retried.
	ErrUnavailable = errors.New("kvstore unavailable")
	// ErrConflict is wrapped when an operation lost its race more often
	// than its retry bound allows.
	ErrConflict = errors.New("kvstore conflict")
)

// Defaults.
const (
	DefaultPrefix         = "membrane/"
	DefaultLeaseTTL       = 15 * time.Second
	DefaultDialTimeout    = 5 * time.Second
	DefaultRequestTimeout = 5 * time.Second
	DefaultGCInterval     = time.Minute
	DefaultGCGrace        = 5 * time.Minute
)

// Config configures the connection to etcd.
type Config struct {
	// Endpoints are etcd's client URLs (--etcd-endpoints), http:// or
	// https://.
	Endpoints []string
	// CAFile, CertFile and KeyFile configure TLS (--etcd-ca, --etcd-cert,
	// --etcd-key): CAFile verifies the server; CertFile and KeyFile (both
	// or neither) are this node's client certificate. Any of them turns
	// TLS on, and then every endpoint must be https:// (Validate refuses
	// http://: the client would silently connect in plaintext).
	CAFile, CertFile, KeyFile string
	// NodeName is this node's name (--node-name): a DNS-1123 subdomain.
	NodeName string
	// Prefix is prepended to every key (default "membrane/"); it must end
	// in "/".
	Prefix string
	// LeaseTTL is the node lease's time to live (--kvstore-lease-ttl,
	// default 15 s, at least 2 s): the time after which a node that
	// stopped renewing it loses its identity references, endpoints and
	// node entry.
	LeaseTTL time.Duration
	// DialTimeout bounds connecting (default 5 s); RequestTimeout bounds
	// each call (default 5 s).
	DialTimeout, RequestTimeout time.Duration
	// GCInterval is the time between identity GC passes (default 1 min;
	// negative disables GC on this node); GCGrace is how long an
	// unreferenced identity stays marked before it is removed (default
	// 5 min).
	GCInterval, GCGrace time.Duration
	// Trace (nil: none) is told when remote endpoint changes pass each
	// phase from the writer to the other nodes' send loops (the
	// simulator's per-phase clock).
	Trace Trace
}

// nodeName is a DNS-1123 subdomain, as Kubernetes node names are.
var nodeName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// withDefaults fills the zero fields.
func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	for _, d := range []struct {
		f *time.Duration
		v time.Duration
	}{{&c.LeaseTTL, DefaultLeaseTTL}, {&c.DialTimeout, DefaultDialTimeout}, {&c.RequestTimeout, DefaultRequestTimeout},
		{&c.GCInterval, DefaultGCInterval}, {&c.GCGrace, DefaultGCGrace}} {
		if *d.f == 0 {
			*d.f = d.v
		}
	}
	return c
}

// Validate names the bad field by its flag.
func (c Config) Validate() error {
	c = c.withDefaults()
	if len(c.Endpoints) == 0 {
		return fmt.Errorf("--etcd-endpoints: at least one endpoint is required: %w", ErrInvalidConfig)
	}
	for _, ep := range c.Endpoints {
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return fmt.Errorf("--etcd-endpoints: %q: want http://host:port or https://host:port: %w", ep, ErrInvalidConfig)
		}
		// TLS files with an http:// endpoint would connect in plaintext:
		// the client only uses TLS for https:// endpoints.
		if u.Scheme == "http" && (c.CAFile != "" || c.CertFile != "" || c.KeyFile != "") {
			return fmt.Errorf("--etcd-endpoints: %q is plaintext http:// but %s is given: use https:// (TLS is never applied to http:// endpoints): %w",
				ep, c.tlsFlags(), ErrInvalidConfig)
		}
	}
	switch {
	case len(c.NodeName) > 253 || !nodeName.MatchString(c.NodeName):
		return fmt.Errorf("--node-name: %q: want a DNS-1123 subdomain: %w", c.NodeName, ErrInvalidConfig)
	case !strings.HasSuffix(c.Prefix, "/") || strings.HasPrefix(c.Prefix, "/"):
		return fmt.Errorf("kvstore prefix %q: want a relative prefix ending in /: %w", c.Prefix, ErrInvalidConfig)
	case (c.CertFile == "") != (c.KeyFile == ""):
		return fmt.Errorf("--etcd-cert, --etcd-key: give both or neither: %w", ErrInvalidConfig)
	case c.LeaseTTL < 2*time.Second:
		return fmt.Errorf("--kvstore-lease-ttl: %s: at least 2s: %w", c.LeaseTTL, ErrInvalidConfig)
	case c.DialTimeout < 0 || c.RequestTimeout < 0 || c.GCGrace < 0:
		return fmt.Errorf("kvstore timeouts: negative: %w", ErrInvalidConfig)
	}
	if _, err := c.tlsConfig(); err != nil {
		return fmt.Errorf("--etcd-ca, --etcd-cert, --etcd-key: %w: %w", err, ErrInvalidConfig)
	}
	return nil
}

// tlsFlags names the TLS flags that are set.
func (c Config) tlsFlags() string {
	var set []string
	for _, f := range []struct{ flag, v string }{{"--etcd-ca", c.CAFile}, {"--etcd-cert", c.CertFile}, {"--etcd-key", c.KeyFile}} {
		if f.v != "" {
			set = append(set, f.flag)
		}
	}
	return strings.Join(set, ", ")
}

// tlsConfig loads the TLS files; nil when none is given.
func (c Config) tlsConfig() (*tls.Config, error) {
	if c.CAFile == "" && c.CertFile == "" {
		return nil, nil
	}
	info := transport.TLSInfo{CertFile: c.CertFile, KeyFile: c.KeyFile, TrustedCAFile: c.CAFile}
	cfg, err := info.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load etcd TLS files: %w", err)
	}
	return cfg, nil
}
