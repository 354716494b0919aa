package datapath

import (
	"context"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// prepared is a program load that Linux.Prepare started ahead of the
// endpoint's first Realize: done closes when progs (or err) are set.
type prepared struct {
	identity identity.NumericIdentity
	done     chan struct{}
	progs    programs
	err      error
}

// claimed marks an endpoint whose Realize runs (a Prepare then does
// nothing).
var claimed = func() *prepared {
	p := &prepared{done: make(chan struct{})}
	close(p.done)
	return p
}()

var _ Preparer = (*Linux)(nil)

// Prepare implements Preparer: it opens the endpoint's policy maps and
// loads its programs for ep.Identity, so that the Realize that follows
// (once the endpoint's state is durable) only attaches them. It changes
// nothing the endpoint's traffic sees. It does nothing for an endpoint
// without a host interface index, one whose programs run already, or one
// whose Realize runs. A Prepare the worker pool runs only after the
// endpoint's Remove (a DELETE right after the PUT) leaves its pinned
// maps as an orphan pin directory: the garbage collector removes it and
// what this Prepare loaded (forgetEndpointState).
func (l *Linux) Prepare(_ context.Context, ep *endpoint.Endpoint) {
	if l.bpf == nil || ep.IfIndex == 0 {
		return
	}
	start := time.Now()
	_ = l.guard(func() error {
		if l.bpf.prepare(ep) {
			l.phase(PhaseBPFPrepare, start)
		}
		return nil
	})
}

// prepare reports whether it loaded the programs.
func (b *bpfState) prepare(ep *endpoint.Endpoint) bool {
	b.mu.Lock()
	e := b.eps[ep.ID]
	if _, busy := b.prep[ep.ID]; busy || (e != nil && e.attached) {
		b.mu.Unlock()
		return false
	}
	p := &prepared{identity: ep.Identity, done: make(chan struct{})}
	b.prep[ep.ID] = p
	b.mu.Unlock()
	defer close(p.done)
	if e == nil {
		if e, p.err = b.openEndpoint(ep, b.endpointDir(ep.ID), ep.IfIndex); p.err != nil {
			return false
		}
	}
	if e.attached { // adopted from a previous agent
		return false
	}
	p.progs, p.err = b.tmpl.load(b.maps, e.policyMap, e.cidrMap, ep.ID, ep.Identity)
	return p.err == nil
}

// claim marks id's Realize as running and returns the programs a
// Prepare loaded for ident, if any (waiting for a Prepare that runs).
// release ends the claim.
func (b *bpfState) claim(id endpoint.ID, ident identity.NumericIdentity) (programs, bool) {
	b.mu.Lock()
	p := b.prep[id]
	b.prep[id] = claimed
	b.mu.Unlock()
	if p == nil || p == claimed {
		return programs{}, false
	}
	<-p.done // a Prepare registers itself only once it runs
	if p.err != nil || p.identity != ident || p.progs.from == nil {
		p.progs.close()
		return programs{}, false
	}
	return p.progs, true
}

func (b *bpfState) release(id endpoint.ID) {
	b.mu.Lock()
	if b.prep[id] == claimed {
		delete(b.prep, id)
	}
	b.mu.Unlock()
}

// dropPrepared closes what a Prepare of id loaded and nobody used
// (waiting for one that runs); for the endpoint's removal.
func (b *bpfState) dropPrepared(id endpoint.ID) {
	b.mu.Lock()
	p := b.prep[id]
	delete(b.prep, id)
	b.mu.Unlock()
	if p != nil && p != claimed {
		<-p.done
		p.progs.close()
	}
}
