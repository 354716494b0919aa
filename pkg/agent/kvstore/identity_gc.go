package kvstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// gcState is the collector's memory between passes.
type gcState struct {
	// mu serialises this node's passes.
	mu sync.Mutex
	// seen maps a GC mark's CreateRevision to when this node first saw
	// it: the grace period is measured on this node's clock, never by
	// comparing clocks of nodes. Used by the gc goroutine only.
	seen map[int64]time.Time
	// collector says this node held the collector key at its last pass
	// (logged when it changes). Used by the gc goroutine only.
	collector bool
	// passes counts the passes gcLoop ran.
	passes atomic.Uint64
}

// GCStats counts what one pass did.
type GCStats struct {
	Identities, Marked, Swept, Unmarked int
}

// refsLoop writes every held reference again under the current lease
// (after a new lease was granted, or an Acquire raced a lease change) and
// retries failed releases, until every one succeeded.
func (b *IdentityBackend) refsLoop() {
	backoff := 100 * time.Millisecond
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-b.kick:
		}
		for b.syncRefs() != nil {
			if !sleep(b.ctx, backoff) {
				return
			}
			backoff = min(2*backoff, 2*time.Second)
		}
		backoff = 100 * time.Millisecond
	}
}

// syncRefs writes every held reference under the current lease and
// deletes the references of failed releases.
func (b *IdentityBackend) syncRefs() error {
	lease, ok := b.c.Lease()
	if !ok {
		return ErrUnavailable
	}
	b.mu.Lock()
	held := make(map[identity.NumericIdentity]string, len(b.held))
	for n, lk := range b.held {
		held[n] = lk
	}
	rel := make(map[identity.NumericIdentity]string, len(b.releasing))
	for n, lk := range b.releasing {
		rel[n] = lk
	}
	b.mu.Unlock()
	for n, lk := range held {
		if err := b.restoreHeld(n, lk, lease); err != nil {
			return err
		}
	}
	for n, lk := range rel {
		if err := b.dropRef(b.ctx, n, lk); err != nil {
			return err
		}
	}
	if cur, _ := b.c.Lease(); cur != lease {
		b.poke()
	}
	return nil
}

// restoreHeld rewrites the reference to n unless it was released since
// the refs loop read the held set.
func (b *IdentityBackend) restoreHeld(n identity.NumericIdentity, lk string, lease clientv3.LeaseID) error {
	b.refsMu.Lock()
	defer b.refsMu.Unlock()
	b.mu.Lock()
	_, still := b.held[n]
	b.mu.Unlock()
	if !still {
		return nil
	}
	return b.restoreRef(n, lk, lease)
}

// restoreRef writes this node's reference to n under lease. If the
// identity was collected while this node's references were gone (its
// lease expired), it is created again with the same number and labels
// when both are still free; otherwise the number now means something
// else, which is logged and reported in the status.
func (b *IdentityBackend) restoreRef(n identity.NumericIdentity, lk string, lease clientv3.LeaseID) error {
	ikey, lkey, ref := b.keys.id(n), b.keys.labels(lk), b.keys.ref(lk, b.node)
	var resp *clientv3.TxnResponse
	err := b.c.call(b.ctx, "restore identity reference", func(ctx context.Context) (err error) {
		resp, err = b.c.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(ikey), "=", lk)).
			Then(clientv3.OpPut(ref, "", clientv3.WithLease(lease)), clientv3.OpDelete(b.keys.gc(lk))).
			Else(clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(ikey), "=", 0), clientv3.Compare(clientv3.CreateRevision(lkey), "=", 0)},
				[]clientv3.Op{clientv3.OpPut(lkey, itoa(n)), clientv3.OpPut(ikey, lk), clientv3.OpPut(ref, "", clientv3.WithLease(lease)),
					clientv3.OpDelete(b.keys.gc(lk))},
				nil)).
			Commit()
		return err
	})
	if err != nil {
		return err
	}
	if !resp.Succeeded && !resp.Responses[0].GetResponseTxn().GetSucceeded() {
		b.log.Error("identity number reused while this node's references were gone; the agent moves its endpoints to the store's number for the labels",
			"id", n, "labels", lk)
		b.c.observeConflict("identity " + itoa(n) + " was collected and its number reused")
	}
	return nil
}

// gcLoop runs a collection pass every GCInterval (jittered by up to a
// tenth, so that nodes started together do not collide every time) while
// this node is the cluster's collector (collectorTurn).
func (b *IdentityBackend) gcLoop() {
	for {
		b.mu.Lock()
		d := b.c.cfg.GCInterval + time.Duration(b.rnd.Int64N(int64(b.c.cfg.GCInterval/10)+1))
		b.mu.Unlock()
		if !sleep(b.ctx, d) {
			return
		}
		if !b.collectorTurn(b.ctx) {
			continue
		}
		b.gc.passes.Add(1)
		if st, err := b.CollectGarbage(b.ctx); err != nil {
			b.log.Debug("identity gc pass failed", "err", err)
		} else if st.Marked+st.Swept > 0 {
			b.log.Info("identity gc pass", "identities", st.Identities, "marked", st.Marked, "swept", st.Swept)
		}
	}
}

// collectorTurn reports whether this node is the cluster's identity
// collector: the node the collector key names, under this node's current
// lease; when no node is, it takes the key. One node collecting at a
// time makes a pass's read of every reference (nodes x label sets keys)
// one read per interval for the cluster instead of one per node, which
// grew with the square of the node count in etcd's and every agent's
// CPU. Safety does not rest on it: a pass's transactions are guarded, so
// any number of nodes may collect at once (an older agent, a collector
// whose lease expired while it was in a pass). A collector that goes away
// loses the key with its lease, and another node takes it at its next
// interval; the new collector measures a mark's grace from when it first
// sees it, so a change of collector only delays a sweep.
func (b *IdentityBackend) collectorTurn(ctx context.Context) bool {
	lease, ok := b.c.Lease()
	if !ok {
		return false
	}
	key := b.keys.collector()
	var resp *clientv3.GetResponse
	err := b.c.call(ctx, "read identity collector", func(ctx context.Context) (err error) {
		resp, err = b.c.cli.Get(ctx, key)
		return err
	})
	if err != nil {
		return false
	}
	mine := false
	if len(resp.Kvs) > 0 {
		kv := resp.Kvs[0]
		mine = string(kv.Value) == b.node && clientv3.LeaseID(kv.Lease) == lease
	} else {
		var tr *clientv3.TxnResponse
		err = b.c.call(ctx, "take identity collector", func(ctx context.Context) (err error) {
			tr, err = b.c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
				Then(clientv3.OpPut(key, b.node, clientv3.WithLease(lease))).Commit()
			return err
		})
		mine = err == nil && tr.Succeeded
	}
	if mine != b.gc.collector {
		b.gc.collector = mine
		b.log.Info("identity collector changed", "this-node-collects", mine, "lease", fmt.Sprintf("%x", int64(lease)))
	}
	return mine
}

// gcView is one read of the identities directory.
type gcView struct {
	ids   map[identity.NumericIdentity]string // number -> labels key
	refs  map[string]int                      // refHash -> references
	marks map[string]gcMark                   // refHash -> mark
}

// gcMark is a GC mark as read.
type gcMark struct {
	rev int64  // its CreateRevision
	lk  string // the labels key it marks
}

// CollectGarbage runs one pass of the two-phase collection: an identity
// that no node references is marked (a transaction guarded on "no
// reference, not marked, same labels"); a mark this node has seen for
// GCGrace is swept (guarded on "same mark, still no reference, same
// labels"). Adding a reference deletes the mark, and a reference added
// after the pass read the store fails the guard, so a referenced
// identity is never removed. Every node may run passes concurrently.
func (b *IdentityBackend) CollectGarbage(ctx context.Context) (GCStats, error) {
	b.gc.mu.Lock()
	defer b.gc.mu.Unlock()
	v, err := b.gcRead(ctx)
	if err != nil {
		return GCStats{}, err
	}
	st := GCStats{Identities: len(v.ids)}
	now := time.Now()
	live := map[int64]bool{}
	for n, lk := range v.ids {
		h := refHash(lk)
		if v.refs[h] > 0 {
			continue
		}
		m, marked := v.marks[h]
		delete(v.marks, h)
		if !marked {
			cmps, ops := b.markOps(n, lk)
			rev, err := b.gcTxn(ctx, cmps, ops)
			if err != nil {
				return st, err
			}
			if rev != 0 { // the mark's CreateRevision: its grace starts now
				b.gc.seen[rev], live[rev] = now, true
				st.Marked++
			}
			continue
		}
		live[m.rev] = true
		first, ok := b.gc.seen[m.rev]
		if !ok {
			b.gc.seen[m.rev] = now
			continue
		}
		if now.Sub(first) < b.c.cfg.GCGrace {
			continue
		}
		cmps, ops := b.sweepOps(n, lk, m.rev)
		rev, err := b.gcTxn(ctx, cmps, ops)
		if err != nil {
			return st, err
		}
		st.Swept += btoi(rev != 0)
	}
	for _, m := range v.marks { // marks of label sets that are gone
		rev, err := b.gcTxn(ctx, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(b.keys.gc(m.lk)), "=", m.rev),
			clientv3.Compare(clientv3.CreateRevision(b.keys.labels(m.lk)), "=", 0)}, []clientv3.Op{clientv3.OpDelete(b.keys.gc(m.lk))})
		if err != nil {
			return st, err
		}
		st.Unmarked += btoi(rev != 0)
	}
	for rev := range b.gc.seen {
		if !live[rev] {
			delete(b.gc.seen, rev)
		}
	}
	return st, nil
}

func (b *IdentityBackend) markOps(n identity.NumericIdentity, lk string) ([]clientv3.Cmp, []clientv3.Op) {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(b.keys.id(n)), "=", lk),
		clientv3.Compare(clientv3.CreateRevision(b.keys.refs(lk)), "=", 0).WithPrefix(),
		clientv3.Compare(clientv3.CreateRevision(b.keys.gc(lk)), "=", 0),
	}, []clientv3.Op{clientv3.OpPut(b.keys.gc(lk), lk)}
}

func (b *IdentityBackend) sweepOps(n identity.NumericIdentity, lk string, rev int64) ([]clientv3.Cmp, []clientv3.Op) {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(b.keys.gc(lk)), "=", rev),
		clientv3.Compare(clientv3.CreateRevision(b.keys.refs(lk)), "=", 0).WithPrefix(),
		clientv3.Compare(clientv3.Value(b.keys.id(n)), "=", lk),
		clientv3.Compare(clientv3.Value(b.keys.labels(lk)), "=", itoa(n)),
	}, []clientv3.Op{clientv3.OpDelete(b.keys.id(n)), clientv3.OpDelete(b.keys.labels(lk)), clientv3.OpDelete(b.keys.gc(lk))}
}

// gcTxn commits If(cmps) Then(ops); rev is the revision it wrote, 0 when
// the guard failed.
func (b *IdentityBackend) gcTxn(ctx context.Context, cmps []clientv3.Cmp, ops []clientv3.Op) (rev int64, err error) {
	var resp *clientv3.TxnResponse
	err = b.c.call(ctx, "identity gc", func(ctx context.Context) (err error) {
		resp, err = b.c.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		return err
	})
	if err != nil || !resp.Succeeded {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// gcRead reads ids, references and marks in one consistent Get.
func (b *IdentityBackend) gcRead(ctx context.Context) (gcView, error) {
	var resp *clientv3.GetResponse
	err := b.c.call(ctx, "identity gc read", func(ctx context.Context) (err error) {
		resp, err = b.c.cli.Get(ctx, b.keys.identities(), clientv3.WithPrefix())
		return err
	})
	if err != nil {
		return gcView{}, err
	}
	v := gcView{ids: map[identity.NumericIdentity]string{}, refs: map[string]int{}, marks: map[string]gcMark{}}
	base := b.keys.identities()
	for _, kv := range resp.Kvs {
		rest := strings.TrimPrefix(string(kv.Key), base)
		dir, tail, _ := strings.Cut(rest, "/")
		switch dir {
		case "id":
			if n, ok := parseID(tail); ok {
				v.ids[n] = string(kv.Value)
			}
		case "refs":
			h, _, _ := strings.Cut(tail, "/")
			v.refs[h]++
		case "gc":
			if refHash(string(kv.Value)) == tail { // else not a mark this code wrote
				v.marks[tail] = gcMark{rev: kv.CreateRevision, lk: string(kv.Value)}
			}
		}
	}
	return v, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
