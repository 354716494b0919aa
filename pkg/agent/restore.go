package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/restore"
)

// Validator is implemented by datapaths that can tell, at restore, whether
// an endpoint's kernel side survived the agent's absence (the Linux
// datapath checks Check's netns and host interface; the fake honours
// Forget). Datapaths without it are validated with Check.
type Validator interface {
	Validate(ctx context.Context, ep *endpoint.Endpoint) error
}

// RevisionReporter is implemented by datapaths that remember which
// revision they realised for an endpoint (the fake does; the BPF datapath
// can, from its pinned state). A restored endpoint whose state records
// that revision, and whose identity number is unchanged, becomes ready
// without a regeneration; with datapaths that do not report, every
// restored endpoint regenerates.
type RevisionReporter interface {
	Realized(id endpoint.ID) (rev uint64, ok bool)
}

// RestoreStats says what the last restore did.
type RestoreStats struct {
	// Found is how many state directories were read; Restored how many
	// endpoints came back; Invalid how many failed validation (their
	// datapath did not survive: deleted without releasing their IP);
	// Refused how many the actors refused (a conflict with another
	// endpoint's ID, container or address, or leases that could not be
	// taken again); Quarantined how many directories were moved to
	// <state-dir>/quarantine/ (unreadable, or refused), where no later
	// start reads them.
	Found, Restored, Invalid, Refused, Quarantined int
	// Leases is how long it took until every restored endpoint held its IP
	// and identity again (the API turns ready after it).
	Leases time.Duration
}

// restore reads the state directory and re-creates every endpoint in
// state restoring: validate it, re-reserve its IPs and identity (the
// endpoint actors claim them), then regenerate in the background.
// Endpoints that fail validation are deleted with NoIPRelease: their
// datapath remnants and state go, their IP was never re-reserved.
func (a *Agent) restore(ctx context.Context) error {
	start := time.Now()
	eps, bad := a.store.Scan()
	st := RestoreStats{Found: len(eps) + len(bad), Quarantined: len(bad)}
	for _, b := range bad {
		a.log.Error("unreadable endpoint state set aside", "dir", b.Dir, "quarantined", b.Quarantined, "err", b.Err)
	}
	valid := eps[:0]
	for _, ep := range eps {
		if err := a.validate(ctx, ep); err != nil {
			st.Invalid++
			a.log.Warn("endpoint did not survive the restart; deleting it without releasing its IP", "endpoint", ep.ID, "err", err)
			a.discard(ctx, ep)
			continue
		}
		if rr, ok := a.System.Datapath.(RevisionReporter); ok {
			ep.RealizedRevision, _ = rr.Realized(ep.ID)
		}
		valid = append(valid, ep)
	}
	if len(valid) > 0 {
		r, err := a.System.RestoreEndpoints(ctx, valid)
		if err != nil {
			return fmt.Errorf("restore endpoints: %w", err)
		}
		st.Restored = len(r.Restored)
		for id, err := range r.Failed {
			st.Refused++
			if errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("restore endpoints: %w", err)
			}
			moved, qerr := a.quarantine(id)
			switch {
			case qerr != nil:
				a.log.Error("endpoint refused at restore; its state could not be quarantined and may come back at the next start",
					"endpoint", id, "refused", err, "err", qerr)
			case moved:
				st.Quarantined++
				a.log.Error("endpoint refused at restore; state quarantined", "endpoint", id, "err", err,
					"quarantine", filepath.Join(a.store.Dir(), "quarantine"))
			default: // its actor deleted it, state included
				a.log.Warn("endpoint refused at restore; deleted without releasing its IP", "endpoint", id, "err", err)
			}
		}
	}
	st.Leases = time.Since(start)
	a.restoreStats = st
	if st.Found > 0 {
		a.log.Info("restored endpoints", "found", st.Found, "restored", st.Restored, "invalid", st.Invalid,
			"refused", st.Refused, "quarantined", st.Quarantined, "duration", st.Leases)
	}
	return nil
}

func (a *Agent) validate(ctx context.Context, ep *endpoint.Endpoint) error {
	dp := a.System.Datapath
	if v, ok := dp.(Validator); ok {
		return v.Validate(ctx, ep)
	}
	if err := dp.Check(ctx, ep); err != nil {
		return fmt.Errorf("validate endpoint %d: %w", ep.ID, err)
	}
	return nil
}

// discard removes what is left of an endpoint that failed validation.
func (a *Agent) discard(ctx context.Context, ep *endpoint.Endpoint) {
	if err := a.System.Datapath.Remove(ctx, ep); err != nil && !errors.Is(err, datapath.ErrEndpointMissing) {
		a.log.Warn("removing datapath remnants failed", "endpoint", ep.ID, "err", err)
	}
	done := make(chan error, 1)
	a.store.Remove(ep.ID, func(err error) { done <- err })
	if err := <-done; err != nil {
		a.log.Error("removing endpoint state failed", "endpoint", ep.ID, "err", err)
	}
}

// quarantine moves a refused endpoint's state aside (durably) and
// reports whether there was any.
func (a *Agent) quarantine(id endpoint.ID) (bool, error) {
	type answer struct {
		moved bool
		err   error
	}
	done := make(chan answer, 1)
	a.store.Quarantine(id, func(moved bool, err error) { done <- answer{moved, err} })
	r := <-done
	return r.moved, r.err
}

// RestoreStats returns what the restore at Start did.
func (a *Agent) RestoreStats() RestoreStats { return a.restoreStats }

// StateStats returns the state store's counters (journal group commits,
// fdatasyncs, checkpoints and their times).
func (a *Agent) StateStats() restore.Stats { return a.store.Stats() }
