package actors

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/service"
)

// servicesActor owns the service table: frontend -> backends, fed by
// sources (the Kubernetes watcher, tests) through the front door. It is
// the single writer of the services table and writes the datapath's
// service maps through its reconciler (one pool job at a time, so writes
// of one frontend never overtake each other). A request is answered once
// the job holding its change ended (after the index commit). IDs (the
// backend slots' key) are kept per frontend while the datapath holds it;
// at start the actor reads the maps back and reuses their IDs, so the
// connections a previous agent translated keep their backends.
type servicesActor struct {
	owner
	deps *endpointDeps
	dp   datapath.ServiceDatapath // nil: nothing to write
	log  *slog.Logger

	rows map[service.Frontend]*index.ServiceRow
	// held is what the datapath may hold per frontend: its ID and the
	// highest backend count written (a failed write may have left slots).
	held map[service.Frontend]heldService
	ids  map[uint32]service.Frontend // IDs of rows and of held frontends
	next uint32                      // the next ID to try
	// adopted are the IDs the maps held at start, reused for the same
	// frontend. While the read-back runs the reconciler is paused and
	// requests wait in stash.
	adopted    map[service.Frontend]uint32
	adoptedIDs map[uint32]bool
	stash      []stashed

	// rec writes the changed frontends (their rows, or their absence)
	// and, on ServicePrune, the whole maps. It does nothing without a
	// datapath.
	rec reconciler[service.Frontend]
}

type heldService struct {
	id    uint32
	count int
}

// stashed is a request that arrived while the maps were read back.
type stashed struct {
	msg    any
	sender *actor.PID
}

// serviceOp is one datapath write of a job.
type serviceOp struct {
	svc    datapath.LBService
	delete bool
	prev   int
}

func newServicesActor(deps *endpointDeps) *servicesActor {
	l := deps.log.With("actor", "services")
	a := &servicesActor{deps: deps, log: l, owner: owner{batch: newBatcher(deps.writer, l)}}
	a.onStart = a.rebuild
	a.dp, _ = deps.dp.(datapath.ServiceDatapath)
	var ops reconcileOps[service.Frontend]
	if a.dp != nil {
		ops = reconcileOps[service.Frontend]{update: a.update, prune: a.syncAll}
	}
	a.rec.init(&a.owner, deps, l, ops)
	return a
}

// Receive implements actor.Actor.
func (a *servicesActor) Receive(ctx actor.Context) {
	defer a.batch.flushOnPanic()
	if a.lifecycle(ctx) {
		return
	}
	switch msg := ctx.Message().(type) {
	case *messages.ServiceUpsert, *messages.ServiceDelete:
		if a.rec.paused { // adopting
			a.stash = append(a.stash, stashed{msg: msg, sender: ctx.Sender()})
			return
		}
		a.handle(ctx, msg, ctx.Sender())
	case *messages.ServicePrune:
		a.rec.resync()
		a.rec.sync(ctx)
	case *crashForTest:
		panic("services: crash requested by a test")
	}
}

func (a *servicesActor) handle(ctx actor.Context, msg any, sender *actor.PID) {
	var res *messages.ServiceResult
	var fronts []service.Frontend
	switch m := msg.(type) {
	case *messages.ServiceUpsert:
		res, fronts = a.upsert(ctx, m)
	case *messages.ServiceDelete:
		res, fronts = a.delete(ctx, m)
	}
	if res.Err != nil || len(fronts) == 0 || a.dp == nil {
		a.batch.reply(ctx, sender, res)
		return
	}
	a.rec.wait(fronts, func(err error) {
		if res.Err == nil {
			res.Err = err
		}
		a.batch.reply(ctx, sender, res)
	})
	a.rec.sync(ctx)
}

// rebuild reads the table (empty at agent start) and, at agent start,
// the datapath's maps for their IDs; then everything is written again.
func (a *servicesActor) rebuild(ctx actor.Context) {
	a.rows = map[service.Frontend]*index.ServiceRow{}
	a.held = map[service.Frontend]heldService{}
	a.ids = map[uint32]service.Frontend{}
	a.next = 1
	for _, r := range a.deps.ix.Services() {
		f := r.Service.Frontend
		a.rows[f] = r
		a.ids[r.ID] = f
		a.held[f] = heldService{id: r.ID, count: len(r.Service.Backends)}
		a.rec.mark(f)
	}
	if a.dp == nil {
		return
	}
	if len(a.rows) > 0 {
		a.rec.sync(ctx)
		return
	}
	a.rec.paused = true
	dp := a.dp
	work := &messages.DatapathWork{Op: "services-read", Run: func(c context.Context) (any, error) { return dp.DumpServices(c) }}
	a.req.inPool(ctx, a.deps, work, func(v any, err error) {
		m, _ := v.(datapath.LBMaps)
		a.adopt(ctx, m, err)
	})
}

// adopt records the IDs and slot counts the maps hold, then serves the
// requests that waited.
func (a *servicesActor) adopt(ctx actor.Context, m datapath.LBMaps, err error) {
	a.rec.paused = false
	if err != nil {
		a.log.Warn("reading the service maps back failed; new IDs for every frontend", "err", err)
	}
	a.adopted = make(map[service.Frontend]uint32, len(m.Frontends))
	a.adoptedIDs = make(map[uint32]bool, len(m.Frontends))
	for _, fe := range m.Frontends {
		a.adopted[fe.Frontend] = fe.ID
		a.adoptedIDs[fe.ID] = true
	}
	for _, s := range a.stash {
		a.handle(ctx, s.msg, s.sender)
	}
	a.stash = nil
	a.rec.sync(ctx)
}

// upsert applies m if no frontend belongs to another source.
func (a *servicesActor) upsert(ctx actor.Context, m *messages.ServiceUpsert) (*messages.ServiceResult, []service.Frontend) {
	res := &messages.ServiceResult{}
	want := make(map[service.Frontend]bool, len(m.Services))
	for i := range m.Services {
		f := m.Services[i].Frontend
		if r := a.rows[f]; r != nil && r.Source != m.Source {
			res.Err = fmt.Errorf("upsert service %s from %q: source %q has it: %w", f, m.Source, r.Source, service.ErrConflict)
			return res, nil
		}
		want[f] = true
	}
	var changed []service.Frontend
	for i := range m.Services {
		s := &m.Services[i]
		if r := a.rows[s.Frontend]; r != nil && r.Service.Equal(s) {
			continue
		}
		a.put(ctx, m.Source, *s)
		changed = append(changed, s.Frontend)
		res.Upserted++
	}
	if m.Replace {
		for f, r := range a.rows {
			if r.Source == m.Source && !want[f] {
				a.remove(ctx, f)
				changed = append(changed, f)
				res.Deleted++
			}
		}
	}
	return res, changed
}

func (a *servicesActor) delete(ctx actor.Context, m *messages.ServiceDelete) (*messages.ServiceResult, []service.Frontend) {
	res := &messages.ServiceResult{}
	var changed []service.Frontend
	for _, f := range m.Frontends {
		if r := a.rows[f]; r == nil || r.Source != m.Source {
			continue
		}
		a.remove(ctx, f)
		changed = append(changed, f)
		res.Deleted++
	}
	return res, changed
}

// put writes s's row (pending) with its frontend's ID.
func (a *servicesActor) put(ctx actor.Context, source string, s service.Service) {
	f := s.Frontend
	id := a.idFor(f)
	row := &index.ServiceRow{Service: s, Source: source, ID: id, State: index.ServicePending}
	if a.dp == nil {
		row.State = index.ServiceRealized
	}
	a.rows[f] = row
	a.batch.putKeyed(ctx, index.TableServices, f, row)
	a.rec.mark(f)
}

func (a *servicesActor) remove(ctx actor.Context, f service.Frontend) {
	row := a.rows[f]
	delete(a.rows, f)
	a.batch.delKeyed(ctx, index.TableServices, f, row)
	if _, ok := a.held[f]; !ok {
		delete(a.ids, row.ID)
	}
	a.rec.mark(f)
}

// idFor returns f's ID: its row's, the one the datapath holds, the one
// adopted at start if free, else the lowest free one from next.
func (a *servicesActor) idFor(f service.Frontend) uint32 {
	if r := a.rows[f]; r != nil {
		return r.ID
	}
	if h, ok := a.held[f]; ok {
		return h.id
	}
	if id, ok := a.adopted[f]; ok {
		delete(a.adopted, f)
		delete(a.adoptedIDs, id)
		if _, used := a.ids[id]; !used {
			a.ids[id] = f
			return id
		}
	}
	for {
		id := a.next
		a.next++
		if a.next == 0 {
			a.next = 1
		}
		if _, used := a.ids[id]; !used && !a.adoptedIDs[id] {
			a.ids[id] = f
			return id
		}
	}
}
