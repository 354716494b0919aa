package datapath

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// bpfState is the Linux datapath's BPF side: the parsed template, the
// shared maps, the drop-notification reader and what is realised per
// endpoint.
type bpfState struct {
	dir    string // LinuxConfig.BPFFS
	tmpl   *template
	maps   sharedMaps
	events *ringbuf.Reader

	// mu guards everything below.
	mu sync.Mutex
	// legacy: attach with clsact + cls_bpf (forced, or TCX missing).
	legacy bool
	eps    map[endpoint.ID]*bpfEndpoint
	// prep holds the loads Prepare started and the endpoints whose
	// Realize runs (bpf_prepare_linux.go).
	prep map[endpoint.ID]*prepared
}

// bpfEndpoint is what is realised for one endpoint. The agent never runs
// two operations on one endpoint at once, so its fields need no lock.
// Only the policy maps' file descriptors are kept (two per endpoint):
// the pinned TCX links or the cls_bpf filters hold the programs.
type bpfEndpoint struct {
	policyMap *ebpf.Map
	cidrMap   *ebpf.Map
	// have is what the policy map enforces (never nil), ports the
	// proxy ports of its redirected entries.
	have  *policy.MapState
	ports map[policy.Key]uint16
	// attached: programs loaded for identity run on ifindex (with
	// cls_bpf filters when legacy).
	attached bool
	identity identity.NumericIdentity
	ifindex  int
	legacy   bool
}

var hooks = [2]hook{hookFrom, hookTo}

// noPolicy is an empty MapState: nothing enforced.
var noPolicy = &policy.MapState{}

func (e *bpfEndpoint) close() {
	if e.policyMap != nil {
		e.policyMap.Close()
	}
	if e.cidrMap != nil {
		e.cidrMap.Close()
	}
}

// openBPF mounts the bpffs if needed, parses the template and opens the
// shared maps and the drop-notification reader.
func openBPF(cfg LinuxConfig) (b *bpfState, retErr error) {
	if err := ensureBPFFS(cfg.BPFFS); err != nil {
		return nil, err
	}
	tmpl, err := newTemplate()
	if err != nil {
		return nil, err
	}
	sm, err := tmpl.openShared(cfg.BPFFS)
	if err != nil {
		return nil, err
	}
	rd, err := ringbuf.NewReader(sm.events)
	if err != nil {
		sm.close()
		return nil, fmt.Errorf("open drop notification reader: %w", err)
	}
	return &bpfState{dir: cfg.BPFFS, tmpl: tmpl, maps: sm, events: rd, legacy: cfg.ForceLegacyTC,
		eps: map[endpoint.ID]*bpfEndpoint{}, prep: map[endpoint.ID]*prepared{}}, nil
}

// close releases the file descriptors; pinned objects (and with them the
// programs attached to the endpoints) stay.
func (b *bpfState) close() {
	b.events.Close()
	b.mu.Lock()
	for _, e := range b.eps {
		e.close()
	}
	b.eps = map[endpoint.ID]*bpfEndpoint{}
	prep := b.prep
	b.prep = map[endpoint.ID]*prepared{}
	b.mu.Unlock()
	for _, p := range prep {
		<-p.done
		p.progs.close()
	}
	b.maps.close()
}

// realizeBPF makes endpoint ep's programs run on ifindex enforcing
// ep.Policy. A policy-only change updates the policy map by difference;
// a first realise (also after an agent restart, when the pinned policy
// map is read back) or a new identity or interface loads the programs
// and attaches them (or updates the pinned links in place).
func (l *Linux) realizeBPF(ep *endpoint.Endpoint, ifindex int) error {
	b := l.bpf
	pre, loaded := b.claim(ep.ID, ep.Identity)
	defer b.release(ep.ID)
	defer func() {
		if loaded {
			pre.close() // unused, or held by the links or filters now
		}
	}()
	b.mu.Lock()
	e := b.eps[ep.ID]
	b.mu.Unlock()
	dir := b.endpointDir(ep.ID)
	start := time.Now()
	if e == nil {
		var err error
		if e, err = b.openEndpoint(ep, dir, ifindex); err != nil {
			return err
		}
		l.phase(PhaseBPFMaps, start)
		start = time.Now()
	}
	want := ep.Policy
	if want == nil {
		want = noPolicy
	}
	// Two entries are the enforcement flags.
	if limit := int(b.tmpl.spec.Maps[bpf.EndpointMapPolicy].MaxEntries) - 2; len(want.Allow) > limit {
		return fmt.Errorf("policy of %d entries, at most %d fit the policy map: %w", len(want.Allow), limit, ErrInvalidPolicy)
	}
	if limit := int(b.tmpl.spec.Maps[bpf.EndpointMapCidrPolicy].MaxEntries); len(want.CIDR) > limit {
		return fmt.Errorf("policy of %d CIDR entries, at most %d fit the cidr policy map: %w", len(want.CIDR), limit, ErrInvalidPolicy)
	}
	ports, err := want.Redirects(l.proxyPorts())
	if err != nil {
		return fmt.Errorf("endpoint %d: %w: %w", ep.ID, err, ErrNotSupported)
	}
	if err := syncPolicyMap(e.policyMap, e.cidrMap, policyTarget{e.have, e.ports}, policyTarget{want, ports}); err != nil {
		// Partly applied: read back what the maps hold now.
		if have, hports, rerr := realisedState(e.policyMap, e.cidrMap); rerr == nil {
			e.have, e.ports = have, hports
		}
		return err
	}
	e.have, e.ports = want, ports
	l.phase(PhaseBPFPolicy, start)
	if e.attached && e.identity == ep.Identity && e.ifindex == ifindex {
		return nil
	}
	start = time.Now()
	progs := pre
	if !loaded {
		var err error
		if progs, err = b.tmpl.load(b.maps, e.policyMap, e.cidrMap, ep.ID, ep.Identity); err != nil {
			return err
		}
		defer progs.close() // the links or filters hold them
	}
	l.phase(PhaseBPFLoad, start)
	start = time.Now()
	e.attached = false
	if err := l.attach(e, dir, ifindex, progs); err != nil {
		return err
	}
	l.phase(PhaseBPFAttach, start)
	e.attached, e.identity, e.ifindex = true, ep.Identity, ifindex
	return nil
}

// openEndpoint opens (or creates) the endpoint's pinned policy maps and
// reads back what they enforce; when a previous agent left this build's
// programs attached for the same identity and interface, it adopts them
// (nothing is reloaded). A map that is new (the other one left by an
// older build) means the programs are reloaded.
func (b *bpfState) openEndpoint(ep *endpoint.Endpoint, dir string, ifindex int) (*bpfEndpoint, error) {
	pm, created, err := openEndpointMap(b.tmpl.spec.Maps[bpf.EndpointMapPolicy], dir, pinPolicy)
	if err != nil {
		return nil, err
	}
	cm, cidrCreated, err := openEndpointMap(b.tmpl.spec.Maps[bpf.EndpointMapCidrPolicy], dir, pinCIDR)
	if err != nil {
		pm.Close()
		return nil, err
	}
	e := &bpfEndpoint{policyMap: pm, cidrMap: cm, have: noPolicy}
	if !created || !cidrCreated {
		// Either map may hold entries even when the other is new.
		if e.have, e.ports, err = realisedState(pm, cm); err != nil {
			e.close()
			return nil, err
		}
	}
	if !created && !cidrCreated {
		b.mu.Lock()
		legacy := b.legacy
		b.mu.Unlock()
		if !legacy && b.adopt(dir, ep.ID, ep.Identity, ifindex, pm, cm) {
			e.attached, e.identity, e.ifindex = true, ep.Identity, ifindex
		}
	}
	b.mu.Lock()
	b.eps[ep.ID] = e
	b.mu.Unlock()
	return e, nil
}

// attach runs progs on ifindex with TCX (updating the links in place)
// or, where TCX is missing or ForceLegacyTC is set, cls_bpf filters.
func (l *Linux) attach(e *bpfEndpoint, dir string, ifindex int, p programs) error {
	progs := [2]*ebpf.Program{p.from, p.to}
	b := l.bpf
	b.mu.Lock()
	legacy := b.legacy
	b.mu.Unlock()
	for i := 0; i < len(hooks) && !legacy; i++ {
		lk, err := attachTCX(dir, hooks[i], ifindex, progs[i], l.inHost)
		if errors.Is(err, ebpf.ErrNotSupported) {
			l.log.Warn("kernel has no TCX: attaching endpoint programs with clsact + cls_bpf", "err", err)
			b.mu.Lock()
			b.legacy = true
			b.mu.Unlock()
			legacy = true
			break
		}
		if err != nil {
			return err
		}
		lk.Close() // pinned
	}
	if !legacy {
		e.legacy = false
		return nil
	}
	if e.legacy && e.ifindex != 0 && e.ifindex != ifindex {
		for _, h := range hooks {
			if err := detachLegacy(l.nl, h, e.ifindex); err != nil {
				l.log.Warn("detach legacy filter from the old interface", "ifindex", e.ifindex, "err", err)
			}
		}
	}
	for i, h := range hooks {
		if err := attachLegacy(l.nl, h, ifindex, progs[i]); err != nil {
			return err
		}
	}
	e.legacy = true
	return nil
}

// removeBPF unpins endpoint id's objects and detaches its programs from
// ifindex (0: unknown, the filters die with the interface). Closing the
// TCX links (which detaches them and waits for an RCU grace period) is
// left to the worker pool. Removing a missing endpoint is success.
func (l *Linux) removeBPF(id endpoint.ID, ifindex int) error {
	b := l.bpf
	b.dropPrepared(id)
	b.mu.Lock()
	e := b.eps[id]
	delete(b.eps, id)
	legacy := b.legacy
	b.mu.Unlock()
	dir := b.endpointDir(id)
	var closers []io.Closer
	if e != nil {
		legacy = legacy || e.legacy
		if ifindex == 0 {
			ifindex = e.ifindex
		}
		e.close()
	}
	for _, h := range hooks {
		lk, err := detachTCX(dir, h)
		if err != nil {
			return fmt.Errorf("remove endpoint %d programs: %w", id, err)
		}
		if lk != nil {
			closers = append(closers, lk)
		}
		if legacy && ifindex != 0 {
			if err := detachLegacy(l.nl, h, ifindex); err != nil {
				return fmt.Errorf("remove endpoint %d programs: %w", id, err)
			}
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove endpoint %d programs: %w", id, err)
	}
	if err := deleteDropCounters(b.maps.drops, id); err != nil {
		return err
	}
	if n, err := flushConntrack(b.maps.ct, id); err != nil {
		return err
	} else if n > 0 {
		l.log.Debug("conntrack entries flushed", "endpoint", id, "entries", n)
	}
	if len(closers) > 0 {
		l.closeLater(closers)
	}
	return nil
}

// closeLater closes cs in the worker pool (LinuxHooks.Submit) or on a
// new goroutine before the hooks are set; TeardownDelay < 0 closes them
// at once.
func (l *Linux) closeLater(cs []io.Closer) {
	run := func(context.Context) error {
		for _, c := range cs {
			c.Close()
		}
		return nil
	}
	l.mu.Lock()
	submit := l.hooks.Submit
	l.mu.Unlock()
	switch {
	case l.cfg.TeardownDelay < 0:
		_ = run(context.Background())
	case submit != nil:
		submit("bpf-detach", run)
	default:
		go func() { _ = run(context.Background()) }()
	}
}

// DumpCIDRPolicy implements CIDRPolicyDumper: the realised CIDR policy
// map of endpoint id with its counters (also one pinned by a previous
// agent). Returns ErrEndpointMissing if id has no CIDR policy map.
func (l *Linux) DumpCIDRPolicy(_ context.Context, id endpoint.ID) (entries []CIDRPolicyEntry, err error) {
	err = l.guardBPF(func(b *bpfState) error {
		b.mu.Lock()
		e := b.eps[id]
		b.mu.Unlock()
		if e != nil {
			entries, err = dumpCIDRMap(e.cidrMap)
			return err
		}
		cm, lerr := ebpf.LoadPinnedMap(filepath.Join(b.endpointDir(id), pinCIDR), nil)
		if errors.Is(lerr, os.ErrNotExist) {
			return fmt.Errorf("dump cidr policy of endpoint %d: %w", id, ErrEndpointMissing)
		}
		if lerr != nil {
			return fmt.Errorf("dump cidr policy of endpoint %d: %w", id, lerr)
		}
		defer cm.Close()
		entries, err = dumpCIDRMap(cm)
		return err
	})
	return entries, err
}

// DumpPolicy implements PolicyDumper: the realised policy map of
// endpoint id with its counters (also one pinned by a previous agent).
// Returns ErrEndpointMissing if id has no policy map.
func (l *Linux) DumpPolicy(_ context.Context, id endpoint.ID) (entries []PolicyEntry, ingress, egress bool, err error) {
	err = l.guardBPF(func(b *bpfState) error {
		b.mu.Lock()
		e := b.eps[id]
		b.mu.Unlock()
		m := (*ebpf.Map)(nil)
		if e != nil {
			m = e.policyMap
		} else {
			pm, lerr := ebpf.LoadPinnedMap(filepath.Join(b.endpointDir(id), pinPolicy), nil)
			if errors.Is(lerr, os.ErrNotExist) {
				return fmt.Errorf("dump policy of endpoint %d: %w", id, ErrEndpointMissing)
			}
			if lerr != nil {
				return fmt.Errorf("dump policy of endpoint %d: %w", id, lerr)
			}
			defer pm.Close()
			m = pm
		}
		entries, ingress, egress, err = dumpPolicyMap(m)
		return err
	})
	return entries, ingress, egress, err
}

// DropCounters returns the drop counters of every endpoint by reason and
// direction (packets and bytes since the counter was created).
func (l *Linux) DropCounters(context.Context) (c map[DropKey]Counter, err error) {
	err = l.guardBPF(func(b *bpfState) error {
		c, err = dropCounters(b.maps.drops)
		return err
	})
	return c, err
}

// EndpointDrops implements DropCounterReader: endpoint id's drop
// counters, one lookup per reason and direction.
func (l *Linux) EndpointDrops(_ context.Context, id endpoint.ID) (c map[DropKey]Counter, err error) {
	err = l.guardBPF(func(b *bpfState) error {
		c, err = endpointDropCounters(b.maps.drops, id)
		return err
	})
	return c, err
}

// guardBPF runs fn with the BPF state unless Close ran or Init did not.
func (l *Linux) guardBPF(fn func(b *bpfState) error) error {
	return l.guard(func() error {
		if l.bpf == nil {
			return fmt.Errorf("linux datapath: bpf: %w", ErrClosed)
		}
		return fn(l.bpf)
	})
}

var (
	_ PolicyDumper      = (*Linux)(nil)
	_ CIDRPolicyDumper  = (*Linux)(nil)
	_ DropCounterReader = (*Linux)(nil)
)
