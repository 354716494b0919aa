package identity

import (
	"context"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// ClusterBackend is a cluster-wide identity store: the same label set gets
// the same number on every node. Two backends implement it: Kubernetes
// (a cluster-scoped identity CRD whose object name is the number) and the
// kvstore (etcd). Every method may block on the network, so the identity
// actor calls them only from worker goroutines, never inside Receive, and
// continues with a message when the call returns.
//
// Numbers handed out lie in [MinLocalIdentity, 65535]; reserved identities
// never reach a backend.
type ClusterBackend interface {
	// Acquire returns the cluster-wide identity of ls, creating it when no
	// node has yet, and records that this node uses it. Racing callers on
	// any node agree on one number. Acquire is idempotent per node.
	Acquire(ctx context.Context, ls labels.Labels) (id NumericIdentity, isNew bool, err error)
	// Release records that this node no longer uses id (its last local
	// reference went). The identity itself is removed only by the
	// backend's garbage collection, after a grace period, and never while
	// any node still uses it.
	Release(ctx context.Context, id NumericIdentity) error
	// Watch calls fn for every identity in the cluster: first the full set
	// (a ClusterEvent with Kind ClusterSynced ends it), then changes, until
	// ctx is done. fn is never called concurrently and must not block. It
	// returns nil only when ctx is done or the backend was closed, and an
	// error when the watch failed (the caller watches again).
	Watch(ctx context.Context, fn func(ClusterEvent)) error
	// Status reports the backend's health for /v1/status.
	Status() ClusterStatus
	// Close stops background work (heartbeats, GC) and releases the client.
	Close() error
}

// PreferringBackend is a ClusterBackend that can number a label set it
// does not hold with the number this node already uses for it: an
// endpoint bound to a number while the store could not be asked (or
// restored with its number), whose identity the store collected
// meanwhile. Without it, the store would give the label set a new number
// while the node's endpoints keep the old one, which then exists nowhere
// in the store (another node would not know it, and could reuse it).
type PreferringBackend interface {
	ClusterBackend
	// AcquirePreferred is Acquire, except that when the store holds no
	// number for ls it creates ls with preferred if that number is free
	// (else with any free number). When the store numbers ls already,
	// that number is returned, whatever preferred is.
	AcquirePreferred(ctx context.Context, ls labels.Labels, preferred NumericIdentity) (id NumericIdentity, isNew bool, err error)
}

// SingleNumberBackend is a ClusterBackend whose store numbers a label
// set once at a time (etcd: one labels/ key per label set, created and
// deleted with its id/ key), and whose Acquire reads that number in the
// write that records the node's use. Its answer is then at least as new
// as the watch: another number the watch still reports for the labels
// was collected. A store that may hold one label set under several
// numbers does not implement it (the CRD backend: a preferred number is
// created while its cache does not hold the labels yet, so two objects
// can carry one label set), and a differing answer is not taken over the
// watch.
type SingleNumberBackend interface {
	ClusterBackend
	// SingleNumber reports whether the store numbers a label set once.
	SingleNumber() bool
}

// ClusterEventKind says what a ClusterEvent reports.
type ClusterEventKind int

const (
	// ClusterUpsert: the identity exists with these labels.
	ClusterUpsert ClusterEventKind = iota
	// ClusterDelete: the identity was removed (garbage collected).
	ClusterDelete
	// ClusterSynced: the initial list has been delivered.
	ClusterSynced
	// ClusterResumed: the store is reachable again after it was not (a
	// backend that can tell sends it): label sets waiting for it are
	// retried at once instead of at their next backoff.
	ClusterResumed
)

// ClusterEvent is one identity seen in the cluster store.
type ClusterEvent struct {
	Kind   ClusterEventKind
	ID     NumericIdentity
	Labels labels.Labels
}

// ClusterStatus is a backend's health as /v1/status shows it.
type ClusterStatus struct {
	// Backend is "kubernetes" or "etcd".
	Backend string `json:"backend"`
	// Healthy is false while the store cannot be reached.
	Healthy bool `json:"healthy"`
	// Synced is true once the initial list has been delivered.
	Synced bool `json:"synced"`
	// LastError is the most recent failure, empty when none.
	LastError string `json:"lastError,omitempty"`
	// Since is when Healthy last changed.
	Since time.Time `json:"since"`
}
