package kvstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// ErrExhausted is wrapped when every cluster identity number is taken.
var ErrExhausted = errors.New("no free cluster identity")

// acquireAttempts bounds the optimistic rounds of one Acquire (each lost
// race teaches the cache something, so few are ever needed).
const acquireAttempts = 32

// IdentityBackend is identity.ClusterBackend on etcd. A new label set
// costs one transaction that creates labels/<L> and id/<N> only if both
// are absent, together with this node's reference refs/<N>/<node> under
// its lease; a known one costs one transaction that adds the reference if
// id/<N> still names the label set. No locks: the number is chosen from
// a watched cache of used numbers at random, and a lost race retries.
type IdentityBackend struct {
	c    *Client
	keys keys
	node string
	log  *slog.Logger
	// cache is fed by the backend's own watch of id/.
	cache *idCache
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
	// kick asks the refs loop to write every held reference again (a new
	// lease) and to retry failed releases.
	kick chan struct{}

	// refsMu orders the refs loop's rewrite of a held reference against
	// Release's delete: a rewrite must never land after the delete of a
	// reference released meanwhile (it would outlive every endpoint).
	refsMu sync.Mutex
	// mu guards held, releasing and rnd.
	mu sync.Mutex
	// held is what this node references: number -> labels key.
	held map[identity.NumericIdentity]string
	// releasing are references whose removal failed; the refs loop retries.
	releasing map[identity.NumericIdentity]string
	rnd       *rand.Rand

	gc gcState
}

var (
	_ identity.PreferringBackend   = (*IdentityBackend)(nil)
	_ identity.SingleNumberBackend = (*IdentityBackend)(nil)
)

// SingleNumber implements identity.SingleNumberBackend: labels/<L> holds
// the one number of a label set, and an Acquire reads it in the
// transaction that adds the node's reference.
func (b *IdentityBackend) SingleNumber() bool { return true }

// NewIdentityBackend starts the backend on c: its cache watch, the loop
// that keeps this node's references under the current lease, and (unless
// c's GCInterval is negative) the garbage collector.
func NewIdentityBackend(c *Client) *IdentityBackend {
	ctx, stop := context.WithCancel(c.ctx)
	b := &IdentityBackend{c: c, keys: c.keys, node: c.cfg.NodeName, log: c.log.With("kvstore", "identities"),
		cache: newIDCache(), ctx: ctx, stop: stop, kick: make(chan struct{}, 1),
		held: map[identity.NumericIdentity]string{}, releasing: map[identity.NumericIdentity]string{},
		rnd: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
	b.gc.seen = map[int64]time.Time{}
	b.wg.Add(2)
	go func() { defer b.wg.Done(); c.listWatch(ctx, b.keys.ids(), b.cache) }()
	go func() { defer b.wg.Done(); b.refsLoop() }()
	c.OnLease(func(clientv3.LeaseID) { b.poke() })
	if c.cfg.GCInterval > 0 {
		b.wg.Add(1)
		go func() { defer b.wg.Done(); b.gcLoop() }()
	}
	return b
}

func (b *IdentityBackend) poke() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// Acquire returns the cluster identity of ls and records this node's
// reference. Returns ErrUnavailable (wrapped) when etcd cannot be reached
// or no lease is held yet, ErrConflict after too many lost races,
// ErrExhausted when no number is free.
func (b *IdentityBackend) Acquire(ctx context.Context, ls labels.Labels) (identity.NumericIdentity, bool, error) {
	return b.acquire(ctx, ls, 0)
}

// AcquirePreferred is Acquire, except that a label set the store does
// not number yet is created with preferred when that number is free (see
// identity.PreferringBackend): the number this node's endpoints already
// hold for it. Returns identity.ErrInvalidIdentity (wrapped) for a
// preferred number outside the cluster range.
func (b *IdentityBackend) AcquirePreferred(ctx context.Context, ls labels.Labels, preferred identity.NumericIdentity) (identity.NumericIdentity, bool, error) {
	if preferred < identity.MinLocalIdentity || preferred > maxID {
		return 0, false, fmt.Errorf("acquire cluster identity: preferred number %d outside %d..%d: %w",
			preferred, identity.MinLocalIdentity, maxID, identity.ErrInvalidIdentity)
	}
	return b.acquire(ctx, ls, preferred)
}

// acquire is Acquire trying preferred first for a new label set (0: a
// free number at random).
func (b *IdentityBackend) acquire(ctx context.Context, ls labels.Labels, preferred identity.NumericIdentity) (identity.NumericIdentity, bool, error) {
	if len(ls) == 0 {
		return 0, false, fmt.Errorf("acquire cluster identity: empty label set: %w", labels.ErrInvalidLabel)
	}
	if err := ls.Validate(); err != nil {
		return 0, false, fmt.Errorf("acquire cluster identity: %w", err)
	}
	lk := ls.Key()
	for range acquireAttempts {
		lease, ok := b.c.Lease()
		if !ok && b.c.Health().Healthy && b.c.awaitLease(ctx, 0) {
			// etcd answers and the lease is being granted (at start, or
			// after it lapsed in an outage): one call away.
			lease, ok = b.c.Lease()
		}
		if !ok {
			return 0, false, fmt.Errorf("acquire cluster identity: no node lease yet: %w", ErrUnavailable)
		}
		if n, ok := b.cache.byLabels(lk); ok {
			done, err := b.addRef(ctx, n, lk, lease)
			if b.leaseLost(ctx, err, lease) {
				continue
			}
			if err != nil || done {
				return n, false, err
			}
			b.cache.forget(n, lk) // collected meanwhile
			continue
		}
		n, isNew, err := b.create(ctx, lk, lease, preferred)
		if b.leaseLost(ctx, err, lease) {
			continue
		}
		if err != nil || n != 0 {
			return n, isNew, err
		}
		preferred = 0 // taken by another label set: any free number
	}
	return 0, false, fmt.Errorf("acquire cluster identity for %s: %d lost races: %w", labels.Clip(lk), acquireAttempts, ErrConflict)
}

// leaseLost reports whether err says the node lease used expired (the
// node could not renew it in time); it then waits for the next lease, so
// that the caller tries again under it.
func (b *IdentityBackend) leaseLost(ctx context.Context, err error, lease clientv3.LeaseID) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) && b.c.awaitLease(ctx, lease)
}

// addRef adds this node's reference to n if id/<n> still names lk;
// done is false when it does not.
func (b *IdentityBackend) addRef(ctx context.Context, n identity.NumericIdentity, lk string, lease clientv3.LeaseID) (bool, error) {
	var resp *clientv3.TxnResponse
	err := b.c.call(ctx, "add identity reference", func(ctx context.Context) (err error) {
		resp, err = b.c.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(b.keys.id(n)), "=", lk)).
			Then(clientv3.OpPut(b.keys.ref(lk, b.node), "", clientv3.WithLease(lease)), clientv3.OpDelete(b.keys.gc(lk))).
			Commit()
		return err
	})
	if err != nil || !resp.Succeeded {
		return false, err
	}
	b.hold(n, lk, lease)
	return true, nil
}

// create tries one number for lk (want, else a free one), in one
// transaction: create the label set with that number and this node's
// reference if neither the label set nor the number exists; else, if the
// label set exists, add this node's reference to it and read its number.
// It returns n == 0 (and no error) when the number was taken; the cache
// has then learnt it.
func (b *IdentityBackend) create(ctx context.Context, lk string, lease clientv3.LeaseID, want identity.NumericIdentity) (identity.NumericIdentity, bool, error) {
	n, ok := want, want != 0
	if !ok {
		b.mu.Lock()
		n, ok = b.cache.pickFree(b.rnd)
		b.mu.Unlock()
	}
	if !ok {
		return 0, false, fmt.Errorf("acquire cluster identity: %w", ErrExhausted)
	}
	lkey, ikey, ref := b.keys.labels(lk), b.keys.id(n), b.keys.ref(lk, b.node)
	exists := clientv3.Compare(clientv3.CreateRevision(lkey), ">", 0)
	var resp *clientv3.TxnResponse
	err := b.c.call(ctx, "create identity", func(ctx context.Context) (err error) {
		resp, err = b.c.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(lkey), "=", 0), clientv3.Compare(clientv3.CreateRevision(ikey), "=", 0)).
			Then(clientv3.OpPut(lkey, itoa(n)), clientv3.OpPut(ikey, lk), clientv3.OpPut(ref, "", clientv3.WithLease(lease)),
				clientv3.OpDelete(b.keys.gc(lk))).
			Else(clientv3.OpTxn([]clientv3.Cmp{exists},
				[]clientv3.Op{clientv3.OpGet(lkey), clientv3.OpPut(ref, "", clientv3.WithLease(lease)), clientv3.OpDelete(b.keys.gc(lk))}, nil)).
			Commit()
		return err
	})
	if err != nil {
		return 0, false, err
	}
	if resp.Succeeded {
		b.cache.add(n, lk)
		b.hold(n, lk, lease)
		return n, true, nil
	}
	inner := resp.Responses[0].GetResponseTxn()
	if !inner.GetSucceeded() {
		b.cache.taken(n) // n was taken by another label set
		return 0, false, nil
	}
	kvs := inner.Responses[0].GetResponseRange().GetKvs()
	other, ok := parseID(string(kvs[0].Value))
	if !ok {
		return 0, false, fmt.Errorf("acquire cluster identity: %s holds %q: %w", lkey, kvs[0].Value, ErrConflict)
	}
	b.cache.add(other, lk) // another node created lk: this node now references it
	b.hold(other, lk, lease)
	return other, false, nil
}

// hold records that this node references n. If the lease changed while
// the reference was written, the refs loop writes it again.
func (b *IdentityBackend) hold(n identity.NumericIdentity, lk string, lease clientv3.LeaseID) {
	b.mu.Lock()
	b.held[n] = lk
	delete(b.releasing, n)
	b.mu.Unlock()
	if cur, _ := b.c.Lease(); cur != lease {
		b.poke()
	}
}

// Release removes this node's reference to id. A failure is retried in
// the background (and returned). Releasing an identity this node does not
// hold does nothing.
func (b *IdentityBackend) Release(ctx context.Context, id identity.NumericIdentity) error {
	b.refsMu.Lock()
	defer b.refsMu.Unlock()
	b.mu.Lock()
	lk, ok := b.held[id]
	if !ok {
		lk, ok = b.releasing[id]
	}
	delete(b.held, id)
	shared := ok && b.holdsLabels(lk)
	if ok && !shared {
		b.releasing[id] = lk
	}
	b.mu.Unlock()
	if !ok || shared {
		// The reference key is per label set: when the store renumbered
		// the labels (collected while this node was cut off, numbered
		// anew elsewhere) and this node moved to the new number, the key
		// is the new number's reference and stays.
		return nil
	}
	if err := b.dropRef(ctx, id, lk); err != nil {
		b.poke()
		return fmt.Errorf("release cluster identity %d: %w", id, err)
	}
	return nil
}

// dropRef deletes this node's reference to id unless it was acquired
// again meanwhile.
func (b *IdentityBackend) dropRef(ctx context.Context, id identity.NumericIdentity, lk string) error {
	err := b.c.call(ctx, "delete identity reference", func(ctx context.Context) error {
		_, err := b.c.cli.Delete(ctx, b.keys.ref(lk, b.node))
		return err
	})
	if err != nil {
		return err
	}
	b.mu.Lock()
	delete(b.releasing, id)
	_, again := b.held[id]
	again = again || b.holdsLabels(lk)
	b.mu.Unlock()
	if again { // an Acquire raced the delete (of this number or, renumbered, another): write the reference back
		b.poke()
	}
	return nil
}

// holdsLabels reports whether this node holds a number for the label set
// lk (b.mu held).
func (b *IdentityBackend) holdsLabels(lk string) bool {
	for _, k := range b.held {
		if k == lk {
			return true
		}
	}
	return false
}

// Held returns how many identities this node references.
func (b *IdentityBackend) Held() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.held)
}

// Status reports etcd's health and whether the cache has listed.
func (b *IdentityBackend) Status() identity.ClusterStatus {
	h := b.c.Health()
	return identity.ClusterStatus{Backend: "etcd", Healthy: h.Healthy, Synced: b.cache.isSynced(), LastError: h.LastError, Since: h.Since}
}

// Close stops the backend's goroutines. The Client is shared and closed
// by its owner; references stay until released or the lease expires.
func (b *IdentityBackend) Close() error {
	b.stop()
	b.wg.Wait()
	return nil
}
