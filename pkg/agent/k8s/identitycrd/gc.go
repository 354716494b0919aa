package identitycrd

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
)

// unusedMark is when the collector first saw an identity unused, at
// which resourceVersion.
type unusedMark struct {
	rv    string
	since time.Time
}

// Marks carries what one collector saw unused from pass to pass.
type Marks struct{ unused map[string]unusedMark }

// NewMarks returns empty marks: nothing has been seen unused yet.
func NewMarks() *Marks { return &Marks{unused: make(map[string]unusedMark)} }

// collect runs a garbage collection pass every GCInterval until ctx is
// done.
func (b *Backend) collect(ctx context.Context) {
	marks := NewMarks()
	t := time.NewTicker(b.cfg.GCInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !b.informer.HasSynced() {
			continue
		}
		if err := b.CollectOnce(ctx, marks); err != nil && ctx.Err() == nil {
			b.log.Warn("identity garbage collection pass failed", "err", err)
		}
	}
}

// CollectOnce is one garbage collection pass with marks from the
// earlier passes of the same collector. An identity goes when no counting usage entry was seen on it, at the
// same resourceVersion, for GCGrace; its delete carries that
// resourceVersion as a precondition, so any Acquire marking it meanwhile
// makes the delete fail.
func (b *Backend) CollectOnce(ctx context.Context, marks *Marks) error {
	unused := marks.unused
	live, err := b.liveNodes(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	seen := make(map[string]bool)
	for _, obj := range b.informer.GetStore().List() {
		mi, ok := obj.(*v2.MembraneIdentity)
		if !ok {
			continue
		}
		seen[mi.Name] = true
		if b.inUse(mi, live, now) {
			delete(unused, mi.Name)
			continue
		}
		m, ok := unused[mi.Name]
		if !ok || m.rv != mi.ResourceVersion {
			unused[mi.Name] = unusedMark{rv: mi.ResourceVersion, since: now}
			continue
		}
		if now.Sub(m.since) < b.cfg.GCGrace {
			continue
		}
		if err := b.deleteUnused(ctx, mi); err != nil {
			return err
		}
		delete(unused, mi.Name)
	}
	for name := range unused {
		if !seen[name] {
			delete(unused, name)
		}
	}
	return nil
}

// deleteUnused deletes mi if it is still at the version seen unused.
func (b *Backend) deleteUnused(ctx context.Context, mi *v2.MembraneIdentity) error {
	uid, rv := mi.UID, mi.ResourceVersion
	err := b.res.Delete(ctx, mi.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	switch {
	case err == nil:
		b.collected.Add(1)
		b.log.Info("garbage collected an unused identity", "identity", mi.Name)
	case apierrors.IsNotFound(err):
	case apierrors.IsConflict(err):
		b.gcConflicts.Add(1) // marked meanwhile: in use
	default:
		return fmt.Errorf("delete unused identity %s: %w", mi.Name, err)
	}
	return nil
}

// inUse reports whether an entry of mi counts: its node's lease is fresh
// and the entry is the current agent's (not older than the lease's
// acquireTime), or the node has no fresh lease and the entry is younger
// than the grace period (a node that could not write its lease yet). An
// entry whose time does not parse counts.
func (b *Backend) inUse(mi *v2.MembraneIdentity, live map[string]time.Time, now time.Time) bool {
	for node, ts := range mi.Usage {
		t, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			return true
		}
		if start, ok := live[node]; ok {
			if !t.Before(start) {
				return true
			}
			continue
		}
		if now.Sub(t) < b.cfg.GCGrace {
			return true
		}
	}
	return false
}

// liveNodes returns the nodes whose heartbeat lease was renewed within
// the grace period, with the start of their agent (acquireTime).
func (b *Backend) liveNodes(ctx context.Context) (map[string]time.Time, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	list, err := b.cs.CoordinationV1().Leases(b.cfg.LeaseNamespace).List(cctx, metav1.ListOptions{LabelSelector: LeaseLabel + "=true"})
	if err != nil {
		return nil, fmt.Errorf("list identity heartbeat leases: %w", err)
	}
	now := time.Now()
	live := make(map[string]time.Time)
	for _, l := range list.Items {
		s := l.Spec
		if s.HolderIdentity == nil || s.RenewTime == nil || s.AcquireTime == nil || now.Sub(s.RenewTime.Time) >= b.cfg.GCGrace {
			continue
		}
		live[*s.HolderIdentity] = s.AcquireTime.Time
	}
	return live, nil
}
