package datapath

import (
	"context"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// prepared is a Prepare that runs: done closes when it has finished.
type prepared struct {
	done chan struct{}
}

// claimed marks an endpoint whose Realize runs (a Prepare then does
// nothing).
var claimed = func() *prepared {
	p := &prepared{done: make(chan struct{})}
	close(p.done)
	return p
}()

var _ Preparer = (*Linux)(nil)

// Prepare implements Preparer: it gives the endpoint its policy maps (a
// filled slot of the per-node outer maps, pinned in its directory; or a
// previous agent's, read back), so that
// the Realize that runs alongside (while the state is written) only
// writes the policy, the endpoint's ifindex entry and attaches the
// node's programs (there is nothing to load: they are loaded once per
// node). It changes nothing the endpoint's traffic sees: no interface
// names the endpoint yet. It does nothing for an endpoint without a host
// interface index, one already open, or one whose Realize runs. A
// Prepare the worker pool runs only after the endpoint's Remove (a
// DELETE right after the PUT) leaves its pinned maps as an orphan pin
// directory: the garbage collector removes it and empties its slot
// (forgetEndpointState).
func (l *Linux) Prepare(_ context.Context, ep *endpoint.Endpoint) {
	if l.bpf == nil || ep.IfIndex == 0 {
		return
	}
	start := time.Now()
	_ = l.guard(func() error {
		if l.prepare(ep) {
			l.phase(PhaseBPFPrepare, start)
		}
		return nil
	})
}

// prepare reports whether it opened the endpoint's maps.
func (l *Linux) prepare(ep *endpoint.Endpoint) bool {
	b := l.bpf
	b.mu.Lock()
	e := b.eps[ep.ID]
	if _, busy := b.prep[ep.ID]; busy || e != nil {
		b.mu.Unlock()
		return false
	}
	p := &prepared{done: make(chan struct{})}
	b.prep[ep.ID] = p
	b.mu.Unlock()
	defer close(p.done)
	_, err := l.openEndpoint(ep, b.endpointDir(ep.ID), ep.IfIndex)
	return err == nil
}

// claim marks id's Realize as running, waiting for a Prepare that runs
// (a Prepare registers itself only once it runs). release ends the
// claim.
func (b *bpfState) claim(id endpoint.ID) {
	b.mu.Lock()
	p := b.prep[id]
	b.prep[id] = claimed
	b.mu.Unlock()
	if p != nil && p != claimed {
		<-p.done
	}
}

func (b *bpfState) release(id endpoint.ID) {
	b.mu.Lock()
	if b.prep[id] == claimed {
		delete(b.prep, id)
	}
	b.mu.Unlock()
}

// dropPrepared waits for a Prepare of id that runs; for the endpoint's
// removal.
func (b *bpfState) dropPrepared(id endpoint.ID) {
	b.mu.Lock()
	p := b.prep[id]
	delete(b.prep, id)
	b.mu.Unlock()
	if p != nil && p != claimed {
		<-p.done
	}
}
