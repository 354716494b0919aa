package actors

import (
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
)

// IPAMConfig configures the IPAM actor.
type IPAMConfig struct {
	// IPv4 and IPv6 are the pod CIDRs; either may be invalid (disabled),
	// not both.
	IPv4, IPv6 netip.Prefix
	Strategy   ipam.Strategy
	// Seed feeds the random strategy (0: random seed).
	Seed uint64
	// Expiry releases an address allocated by IPAMAllocate that no
	// endpoint claimed within it, so a crashed ADD never leaks one
	// (default 10 minutes; negative disables).
	Expiry time.Duration
}

// Validate names the bad field.
func (c IPAMConfig) Validate() error {
	if !c.IPv4.IsValid() && !c.IPv6.IsValid() {
		return fmt.Errorf("ipam config: IPv4 or IPv6 range required: %w", ErrInvalidConfig)
	}
	if c.IPv4.IsValid() && !c.IPv4.Addr().Is4() {
		return fmt.Errorf("ipam config: IPv4 range %s is not IPv4: %w", c.IPv4, ErrInvalidConfig)
	}
	if c.IPv6.IsValid() && !c.IPv6.Addr().Is6() {
		return fmt.Errorf("ipam config: IPv6 range %s is not IPv6: %w", c.IPv6, ErrInvalidConfig)
	}
	_, err := c.newPool()
	return err
}

func (c IPAMConfig) newPool() (*ipam.Pool, error) {
	seed := c.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	var v4, v6 *ipam.Range
	var err error
	if c.IPv4.IsValid() {
		if v4, err = ipam.NewRange(c.IPv4, c.Strategy, rand.New(rand.NewPCG(seed, 4))); err != nil {
			return nil, fmt.Errorf("ipam config: IPv4: %w", err)
		}
	}
	if c.IPv6.IsValid() {
		if v6, err = ipam.NewRange(c.IPv6, c.Strategy, rand.New(rand.NewPCG(seed, 6))); err != nil {
			return nil, fmt.Errorf("ipam config: IPv6: %w", err)
		}
	}
	return ipam.NewPool(v4, v6), nil
}

// ipamActor owns the address pools. Each address has an owner (who asked
// for it) and, once an endpoint claimed it, a lease holder: the endpoint
// actor; the endpoint manager reports stopped holders (holderStopped),
// so a stopped actor never orphans an address. It is the single writer of the index's ipam table.
type ipamActor struct {
	owner
	cfg     IPAMConfig
	log     *slog.Logger
	pool    *ipam.Pool
	rows    map[netip.Addr]*index.IP
	holders map[string][]netip.Addr // holder PID ID -> claimed IPs (one or two)
	// unclaimed holds when each allocated but unclaimed address was handed
	// out, for the expiry sweep; addresses kept for their owner by a
	// delete with NoIPRelease (row.Kept) are never in it.
	unclaimed map[netip.Addr]time.Time
	sweep     *time.Timer
}

// sweepExpired asks the IPAM actor to release expired unclaimed addresses.
type sweepExpired struct{}

func newIPAMActor(cfg IPAMConfig, w *indexWriter, log *slog.Logger) *ipamActor {
	l := log.With("actor", "ipam")
	a := &ipamActor{cfg: cfg, log: l, owner: owner{batch: newBatcher(w, l), asksNobody: true}}
	a.onStart, a.onStop = a.rebuild, a.stopSweep
	return a
}

// stopSweep stops the expiry sweep's timer (owner.onStop).
func (a *ipamActor) stopSweep() {
	if a.sweep != nil {
		a.sweep.Stop()
		a.sweep = nil
	}
}

// Receive implements actor.Actor.
func (a *ipamActor) Receive(ctx actor.Context) {
	defer a.batch.flushOnPanic()
	if a.lifecycle(ctx) {
		return
	}
	switch msg := ctx.Message().(type) {
	case *sweepExpired:
		a.sweepExpired(ctx)
	case *messages.IPAMAllocate:
		a.allocate(ctx, msg)
	case *messages.IPAMAllocateIP:
		a.allocateIP(ctx, msg)
	case *messages.IPAMRelease:
		a.release(ctx, msg)
	case *messages.IPAMClaim:
		a.batch.reply(ctx, ctx.Sender(), &messages.IPAMResult{Err: a.claim(ctx, msg)})
	case *messages.IPAMUnclaim:
		a.unclaim(ctx, msg)
		a.batch.reply(ctx, ctx.Sender(), &messages.IPAMResult{})
	case *crashForTest:
		panic("crash requested by a test")
	case *holderStopped:
		a.holderStopped(ctx, msg.who)
	}
}

// rebuild creates the pools and, after a restart, re-reserves every
// address recorded in the index, and releases the leases of holders that
// no longer run (the endpoint manager tells it, holderStopped, of those
// that stop later).
func (a *ipamActor) rebuild(ctx actor.Context) {
	pool, err := a.cfg.newPool()
	if err != nil {
		panic(fmt.Sprintf("ipam: config validated but pool failed: %v", err))
	}
	a.pool = pool
	a.rows = make(map[netip.Addr]*index.IP)
	a.holders = make(map[string][]netip.Addr)
	a.unclaimed = make(map[netip.Addr]time.Time)
	for _, row := range a.batch.ix.IPs("") {
		r := a.pool.RangeFor(row.IP)
		if r == nil {
			a.log.Warn("dropping address outside the configured ranges", "ip", row.IP, "owner", row.Owner)
			a.batch.del(ctx, index.TableIPAM, row)
			continue
		}
		if err := r.Allocate(row.IP, row.Owner); err != nil {
			a.log.Error("re-reserving address failed", "ip", row.IP, "owner", row.Owner, "err", err)
			continue
		}
		a.rows[row.IP] = row
		switch {
		case row.Holder != "":
			a.hold(ctx, row.Holder, row.IP)
		case !row.Kept:
			a.unclaimed[row.IP] = time.Now()
		}
	}
	for _, holder := range deadHolders(ctx, maps.Keys(a.holders)) {
		a.holderStopped(ctx, holder)
	}
	a.scheduleSweep(ctx)
	if n := len(a.rows); n > 0 {
		a.log.Info("rebuilt allocations from the index", "addresses", n)
	}
}

func (a *ipamActor) allocate(ctx actor.Context, msg *messages.IPAMAllocate) {
	var fams []ipam.Family
	switch msg.Family {
	case "":
		for _, f := range []ipam.Family{ipam.IPv4, ipam.IPv6} {
			if a.pool.Range(f) != nil {
				fams = append(fams, f)
			}
		}
	case ipam.IPv4, ipam.IPv6:
		if a.pool.Range(msg.Family) == nil {
			ctx.Respond(&messages.IPAMAllocated{Err: fmt.Errorf("allocate %s: %w", msg.Family, ErrNoRange)})
			return
		}
		fams = []ipam.Family{msg.Family}
	default:
		ctx.Respond(&messages.IPAMAllocated{Err: fmt.Errorf("allocate: unknown family %q: %w", msg.Family, ErrNoRange)})
		return
	}
	res := &messages.IPAMAllocated{}
	for _, f := range fams {
		ip, err := a.pool.Range(f).AllocateNext(msg.Owner)
		if err != nil {
			for _, got := range []netip.Addr{res.IPv4, res.IPv6} {
				if got.IsValid() {
					a.drop(ctx, got)
				}
			}
			ctx.Respond(&messages.IPAMAllocated{Err: fmt.Errorf("allocate %s: %w", f, err)})
			return
		}
		a.record(ctx, &index.IP{IP: ip, Family: string(f), Owner: msg.Owner})
		a.unclaimed[ip] = time.Now()
		if f == ipam.IPv4 {
			res.IPv4 = ip
		} else {
			res.IPv6 = ip
		}
	}
	a.batch.reply(ctx, ctx.Sender(), res)
}

func (a *ipamActor) allocateIP(ctx actor.Context, msg *messages.IPAMAllocateIP) {
	r := a.pool.RangeFor(msg.IP)
	if r == nil {
		ctx.Respond(&messages.IPAMAllocated{Err: fmt.Errorf("allocate %s: %w", msg.IP, ipam.ErrOutOfRange)})
		return
	}
	if err := r.Allocate(msg.IP, msg.Owner); err != nil {
		ctx.Respond(&messages.IPAMAllocated{Err: fmt.Errorf("allocate %s: %w", msg.IP, err)})
		return
	}
	if _, ok := a.rows[msg.IP.Unmap()]; !ok {
		a.record(ctx, &index.IP{IP: msg.IP.Unmap(), Family: string(r.Family()), Owner: msg.Owner})
		a.unclaimed[msg.IP.Unmap()] = time.Now()
	}
	res := &messages.IPAMAllocated{}
	if msg.IP.Unmap().Is4() {
		res.IPv4 = msg.IP.Unmap()
	} else {
		res.IPv6 = msg.IP
	}
	a.batch.reply(ctx, ctx.Sender(), res)
}

func (a *ipamActor) release(ctx actor.Context, msg *messages.IPAMRelease) {
	ip := msg.IP.Unmap()
	if a.pool.RangeFor(ip) == nil || !a.pool.RangeFor(ip).Contains(ip) {
		ctx.Respond(&messages.IPAMReleased{Err: fmt.Errorf("release %s: %w", ip, ipam.ErrOutOfRange)})
		return
	}
	row, ok := a.rows[ip]
	if !ok {
		ctx.Respond(&messages.IPAMReleased{})
		return
	}
	if row.Endpoint != 0 && !msg.Force {
		ctx.Respond(&messages.IPAMReleased{Owner: row.Owner,
			Err: fmt.Errorf("release %s: claimed by endpoint %d: %w", ip, row.Endpoint, ErrIPInUse)})
		return
	}
	if msg.Owner != "" && row.Owner != msg.Owner && !msg.Force {
		ctx.Respond(&messages.IPAMReleased{Owner: row.Owner,
			Err: fmt.Errorf("release %s: allocated to %s, not %s: %w", ip, row.Owner, msg.Owner, ErrIPInUse)})
		return
	}
	a.drop(ctx, ip)
	a.batch.reply(ctx, ctx.Sender(), &messages.IPAMReleased{Released: true, Owner: row.Owner})
}

// claim binds addresses to an endpoint actor, allocating unallocated ones.
func (a *ipamActor) claim(ctx actor.Context, msg *messages.IPAMClaim) error {
	for _, ip := range msg.IPs {
		ip = ip.Unmap()
		r := a.pool.RangeFor(ip)
		if r == nil || !r.Contains(ip) {
			return fmt.Errorf("claim %s: %w", ip, ipam.ErrOutOfRange)
		}
		row, ok := a.rows[ip]
		if ok && row.Endpoint != 0 && row.Endpoint != msg.Endpoint {
			return fmt.Errorf("claim %s: claimed by endpoint %d: %w", ip, row.Endpoint, ErrIPInUse)
		}
		if ok && row.Endpoint == 0 && row.Owner != "" && msg.Owner != "" && row.Owner != msg.Owner {
			return fmt.Errorf("claim %s: allocated to %s, not %s: %w", ip, row.Owner, msg.Owner, ErrIPInUse)
		}
		if !ok {
			if err := r.Allocate(ip, msg.Owner); err != nil {
				return fmt.Errorf("claim %s: %w", ip, err)
			}
			row = &index.IP{IP: ip, Family: string(r.Family()), Owner: msg.Owner}
		}
		c := *row
		c.Endpoint, c.Holder, c.Kept = msg.Endpoint, msg.Holder.Id, false
		a.record(ctx, &c)
		a.hold(ctx, c.Holder, ip)
		delete(a.unclaimed, ip)
	}
	return nil
}

func (a *ipamActor) unclaim(ctx actor.Context, msg *messages.IPAMUnclaim) {
	for _, ip := range msg.IPs {
		row, ok := a.rows[ip.Unmap()]
		if !ok || row.Endpoint != msg.Endpoint {
			continue
		}
		if msg.Release {
			a.drop(ctx, row.IP)
			continue
		}
		// NoIPRelease: the caller provided the address and releases it
		// (Cilium's meaning), so it stays reserved for its owner
		// without expiry.
		a.unhold(row.Holder, row.IP)
		c := *row
		c.Endpoint, c.Holder, c.Kept = 0, "", true
		a.record(ctx, &c)
		delete(a.unclaimed, row.IP)
	}
}

// holderStopped releases every address a stopped endpoint actor still held.
func (a *ipamActor) holderStopped(ctx actor.Context, who *actor.PID) {
	ips := slices.Clone(a.holders[who.Id])
	for _, ip := range ips {
		a.log.Info("releasing address of a stopped endpoint actor", "ip", ip, "holder", who.Id)
		a.drop(ctx, ip)
	}
	delete(a.holders, who.Id)
}

// hold records holder as the lease holder of ip. The endpoint manager
// tells IPAM when a holder stops (holderStopped), and a rebuild checks
// that the holders it finds still run.
func (a *ipamActor) hold(_ actor.Context, holder string, ip netip.Addr) {
	set := a.holders[holder]
	if !slices.Contains(set, ip) {
		a.holders[holder] = append(set, ip)
	}
}

func (a *ipamActor) unhold(holder string, ip netip.Addr) {
	set := slices.DeleteFunc(a.holders[holder], func(x netip.Addr) bool { return x == ip })
	if len(set) == 0 {
		delete(a.holders, holder)
		return
	}
	a.holders[holder] = set
}

func (a *ipamActor) scheduleSweep(ctx actor.Context) {
	if a.cfg.Expiry <= 0 {
		return
	}
	every := min(a.cfg.Expiry/4, 30*time.Second)
	self, system := ctx.Self(), ctx.ActorSystem()
	a.sweep = time.AfterFunc(every, func() { system.Root.Send(self, &sweepExpired{}) })
}

// sweepExpired releases addresses allocated but never claimed within the expiry.
func (a *ipamActor) sweepExpired(ctx actor.Context) {
	deadline := time.Now().Add(-a.cfg.Expiry)
	for ip, since := range a.unclaimed {
		if since.Before(deadline) {
			row := a.rows[ip]
			a.log.Warn("releasing an address no endpoint claimed within the expiry", "ip", ip, "owner", row.Owner, "expiry", a.cfg.Expiry)
			a.drop(ctx, ip)
		}
	}
	a.scheduleSweep(ctx)
}

func (a *ipamActor) record(ctx actor.Context, row *index.IP) {
	a.rows[row.IP] = row
	a.batch.putKeyed(ctx, index.TableIPAM, row.IP, row)
}

// drop releases an address and forgets its row and lease.
func (a *ipamActor) drop(ctx actor.Context, ip netip.Addr) {
	row, ok := a.rows[ip]
	if !ok {
		return
	}
	if r := a.pool.RangeFor(ip); r != nil {
		r.Release(ip)
	}
	if row.Holder != "" {
		a.unhold(row.Holder, ip)
	}
	delete(a.rows, ip)
	delete(a.unclaimed, ip)
	a.batch.delKeyed(ctx, index.TableIPAM, ip, row)
}
