package identitycrd

import (
	"context"
	"fmt"
	"sync"
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

// Marks carries what one collector saw unused from pass to pass, and its
// last verdict on each identity it saw (to explain an identity that
// stays).
type Marks struct {
	unused map[string]unusedMark

	mu       sync.Mutex
	verdicts map[string]Verdict
}

// NewMarks returns empty marks: nothing has been seen unused yet.
func NewMarks() *Marks {
	return &Marks{unused: make(map[string]unusedMark), verdicts: make(map[string]Verdict)}
}

// Decision is what a collector pass did with an identity.
type Decision int

const (
	// DecisionInUse: an entry counts (Node's, written at Entry).
	DecisionInUse Decision = iota + 1
	// DecisionUnused: no entry counts; unchanged at RV since Since, it
	// goes once that is GCGrace ago.
	DecisionUnused
	// DecisionDeleted: deleted at RV.
	DecisionDeleted
	// DecisionGone: the delete found no object (deleted meanwhile).
	DecisionGone
	// DecisionRefused: the delete's precondition failed (RV is no longer
	// the object's version, or its UID is another's); marked again next
	// pass.
	DecisionRefused
	// DecisionFailed: the delete failed with Err; tried again next pass.
	DecisionFailed
)

// Verdict is a collector pass's decision on one identity and its reason.
type Verdict struct {
	At       time.Time
	Decision Decision
	// RV is the resourceVersion the pass saw in the cache.
	RV string
	// Node and Entry: the counting usage entry (DecisionInUse); Why it
	// counts.
	Node, Entry, Why string
	// Since is when the identity was first seen unused at RV.
	Since time.Time
	Err   string
}

func (v Verdict) String() string {
	at := v.At.UTC().Format(time.RFC3339Nano)
	switch v.Decision {
	case DecisionInUse:
		return fmt.Sprintf("%s rv %s: in use: entry of %s at %s counts: %s", at, v.RV, v.Node, v.Entry, v.Why)
	case DecisionUnused:
		return fmt.Sprintf("%s rv %s: unused since %s, waiting for the grace period", at, v.RV, v.Since.UTC().Format(time.RFC3339Nano))
	case DecisionDeleted:
		return fmt.Sprintf("%s rv %s: deleted", at, v.RV)
	case DecisionGone:
		return fmt.Sprintf("%s rv %s: delete found no object", at, v.RV)
	case DecisionRefused:
		return fmt.Sprintf("%s rv %s: delete refused (changed since seen unused)", at, v.RV)
	case DecisionFailed:
		return fmt.Sprintf("%s rv %s: delete failed: %s", at, v.RV, v.Err)
	}
	return fmt.Sprintf("%s rv %s: no decision", at, v.RV)
}

// Verdict returns the last decision on identity name.
func (m *Marks) Verdict(name string) (Verdict, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.verdicts[name]
	return v, ok
}

func (m *Marks) record(name string, v Verdict) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.verdicts[name] = v
}

// collect runs a garbage collection pass every GCInterval until ctx is
// done.
func (b *Backend) collect(ctx context.Context) {
	marks := b.marks
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
		v := Verdict{At: now, RV: mi.ResourceVersion}
		if b.inUse(mi, live, now, &v) {
			v.Decision = DecisionInUse
			marks.record(mi.Name, v)
			delete(unused, mi.Name)
			continue
		}
		m, ok := unused[mi.Name]
		if !ok || m.rv != mi.ResourceVersion {
			m = unusedMark{rv: mi.ResourceVersion, since: now}
			unused[mi.Name] = m
		}
		if now.Sub(m.since) < b.cfg.GCGrace {
			v.Decision, v.Since = DecisionUnused, m.since
			marks.record(mi.Name, v)
			continue
		}
		var err error
		v.Decision, err = b.deleteUnused(ctx, mi)
		if err != nil {
			v.Err = err.Error()
		}
		marks.record(mi.Name, v)
		if err != nil {
			return err
		}
		delete(unused, mi.Name)
	}
	for name := range unused {
		if !seen[name] {
			delete(unused, name)
		}
	}
	marks.mu.Lock()
	for name := range marks.verdicts {
		if !seen[name] {
			delete(marks.verdicts, name)
		}
	}
	marks.mu.Unlock()
	return nil
}

// deleteUnused deletes mi if it is still at the version seen unused.
func (b *Backend) deleteUnused(ctx context.Context, mi *v2.MembraneIdentity) (Decision, error) {
	uid, rv := mi.UID, mi.ResourceVersion
	err := b.res.Delete(ctx, mi.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	switch {
	case err == nil:
		b.collected.Add(1)
		b.log.Info("garbage collected an unused identity", "identity", mi.Name, "resourceVersion", rv)
		return DecisionDeleted, nil
	case apierrors.IsNotFound(err):
		return DecisionGone, nil
	case apierrors.IsConflict(err):
		b.gcConflicts.Add(1) // marked or touched meanwhile: marked again next pass
		b.log.Info("identity changed since seen unused: not collected", "identity", mi.Name, "resourceVersion", rv)
		return DecisionRefused, nil
	}
	return DecisionFailed, fmt.Errorf("delete unused identity %s: %w", mi.Name, err)
}

// inUse reports whether an entry of mi counts, and records which one
// and why in v: its node's lease is fresh and the entry is the current
// agent's (not older than the lease's acquireTime), or the node has no
// fresh lease and the entry is younger than the grace period (a node that
// could not write its lease yet). An entry whose time does not parse
// counts.
func (b *Backend) inUse(mi *v2.MembraneIdentity, live map[string]time.Time, now time.Time, v *Verdict) bool {
	for node, ts := range mi.Usage {
		v.Node, v.Entry = node, ts
		t, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			v.Why = "its time does not parse"
			return true
		}
		if start, ok := live[node]; ok {
			if !t.Before(start) {
				v.Why = "its node's lease is fresh and the entry is not older than the node's agent"
				return true
			}
			continue
		}
		if now.Sub(t) < b.cfg.GCGrace {
			v.Why = "its node has no fresh lease and the entry is within the grace period"
			return true
		}
	}
	v.Node, v.Entry = "", ""
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
