package kvstore

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// idCache is the cluster's identities as the backend's watch of id/ last
// saw them, plus numbers this node learnt are taken before the watch
// delivered them. It only steers Acquire: every write is guarded by a
// transaction, so a stale cache costs a retry, never a wrong answer.
type idCache struct {
	// mu guards everything below.
	mu        sync.Mutex
	byNum     map[identity.NumericIdentity]string
	byLabel   map[string]identity.NumericIdentity
	takenNums map[identity.NumericIdentity]struct{}
	synced    bool
}

func newIDCache() *idCache {
	return &idCache{byNum: map[identity.NumericIdentity]string{}, byLabel: map[string]identity.NumericIdentity{},
		takenNums: map[identity.NumericIdentity]struct{}{}}
}

func (c *idCache) byLabels(lk string) (identity.NumericIdentity, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.byLabel[lk]
	return n, ok
}

func (c *idCache) isSynced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.synced
}

func (c *idCache) add(n identity.NumericIdentity, lk string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.addLocked(n, lk)
}

func (c *idCache) addLocked(n identity.NumericIdentity, lk string) {
	if old, ok := c.byNum[n]; ok && old != lk {
		delete(c.byLabel, old)
	}
	c.byNum[n], c.byLabel[lk] = lk, n
}

// forget drops n -> lk (found collected).
func (c *idCache) forget(n identity.NumericIdentity, lk string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removeLocked(n)
	if c.byLabel[lk] == n {
		delete(c.byLabel, lk)
	}
}

func (c *idCache) removeLocked(n identity.NumericIdentity) {
	if lk, ok := c.byNum[n]; ok {
		delete(c.byNum, n)
		if c.byLabel[lk] == n {
			delete(c.byLabel, lk)
		}
	}
	delete(c.takenNums, n)
}

// taken records that n is in use by a label set not known yet.
func (c *idCache) taken(n identity.NumericIdentity) {
	c.mu.Lock()
	c.takenNums[n] = struct{}{}
	c.mu.Unlock()
}

// pickFree returns a number the cache believes free, chosen at random so
// that racing nodes rarely pick the same one.
func (c *idCache) pickFree(rnd *rand.Rand) (identity.NumericIdentity, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	span := int(maxID-identity.MinLocalIdentity) + 1
	if len(c.byNum)+len(c.takenNums) >= span {
		return 0, false
	}
	start := rnd.IntN(span)
	for i := range span {
		n := identity.MinLocalIdentity + identity.NumericIdentity((start+i)%span)
		_, used := c.byNum[n]
		_, tk := c.takenNums[n]
		if !used && !tk {
			return n, true
		}
	}
	return 0, false
}

// list replaces the cache with a full list of id/ (mark-and-sweep).
func (c *idCache) list(kvs []*mvccpb.KeyValue) {
	c.mu.Lock()
	c.byNum, c.byLabel = map[identity.NumericIdentity]string{}, map[string]identity.NumericIdentity{}
	clear(c.takenNums)
	for _, kv := range kvs {
		if n, lk, ok := c.parse(kv); ok {
			c.addLocked(n, lk)
		}
	}
	c.synced = true
	c.mu.Unlock()
}

func (c *idCache) events(evs []*clientv3.Event) {
	c.mu.Lock()
	for _, ev := range evs {
		n, lk, ok := c.parse(ev.Kv)
		switch {
		case !ok:
		case ev.Type == clientv3.EventTypeDelete:
			c.removeLocked(n)
		default:
			c.addLocked(n, lk)
			delete(c.takenNums, n)
		}
	}
	c.mu.Unlock()
}

// parse reads an id/<N> key; its value is set on puts only.
func (c *idCache) parse(kv *mvccpb.KeyValue) (identity.NumericIdentity, string, bool) {
	_, rest, ok := strings.Cut(string(kv.Key), idDir)
	if !ok {
		return 0, "", false
	}
	n, ok := parseID(rest)
	return n, string(kv.Value), ok
}

// identityWatch turns a list-then-watch of id/ into ClusterEvents: the
// full set and ClusterSynced first, then changes; a re-list delivers
// deletions of what vanished and upserts of what is new or changed.
type identityWatch struct {
	log   func(msg string, args ...any)
	fn    func(identity.ClusterEvent)
	known map[identity.NumericIdentity]string
	first bool
}

func (w *identityWatch) list(kvs []*mvccpb.KeyValue) {
	seen := make(map[identity.NumericIdentity]string, len(kvs))
	for _, kv := range kvs {
		if n, lk, ok := (&idCache{}).parse(kv); ok {
			seen[n] = lk
		}
	}
	for n := range w.known {
		if _, ok := seen[n]; !ok {
			w.fn(identity.ClusterEvent{Kind: identity.ClusterDelete, ID: n})
			delete(w.known, n)
		}
	}
	for n, lk := range seen {
		w.upsert(n, lk)
	}
	if w.first {
		w.first = false
		w.fn(identity.ClusterEvent{Kind: identity.ClusterSynced})
	}
}

func (w *identityWatch) events(evs []*clientv3.Event) {
	for _, ev := range evs {
		n, lk, ok := (&idCache{}).parse(ev.Kv)
		if !ok {
			continue
		}
		if ev.Type == clientv3.EventTypeDelete {
			if _, had := w.known[n]; had {
				delete(w.known, n)
				w.fn(identity.ClusterEvent{Kind: identity.ClusterDelete, ID: n})
			}
			continue
		}
		w.upsert(n, lk)
	}
}

func (w *identityWatch) upsert(n identity.NumericIdentity, lk string) {
	if old, ok := w.known[n]; ok && old == lk {
		return
	}
	ls, err := labels.ParseSet(strings.Split(lk, ";"))
	if err != nil || len(ls) == 0 {
		w.log("identity with unreadable labels ignored", "id", n, "err", err)
		return
	}
	w.known[n] = lk
	w.fn(identity.ClusterEvent{Kind: identity.ClusterUpsert, ID: n, Labels: ls})
}

// Watch calls fn with every identity in the cluster, then with changes,
// until ctx ends (see identity.ClusterBackend). It returns nil when ctx
// ends.
func (b *IdentityBackend) Watch(ctx context.Context, fn func(identity.ClusterEvent)) error {
	var mu sync.Mutex // the list-watch and the resumption goroutine take turns
	call := func(ev identity.ClusterEvent) {
		mu.Lock()
		defer mu.Unlock()
		fn(ev)
	}
	w := &identityWatch{log: b.log.Warn, fn: call, known: map[identity.NumericIdentity]string{}, first: true}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	defer func() { cancel(); <-done }() // no call after Watch returns
	go func() {
		defer close(done)
		for {
			select {
			case <-b.ctx.Done():
				cancel()
				return
			case <-ctx.Done():
				return
			case <-b.c.Resumed():
				if ctx.Err() != nil {
					return
				}
				// etcd is back: waiting label sets need not wait for
				// their next backoff.
				call(identity.ClusterEvent{Kind: identity.ClusterResumed})
			}
		}
	}()
	b.c.listWatch(ctx, b.keys.ids(), w)
	return nil
}
