package datapath

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// bpfState is the Linux datapath's BPF side: the parsed template, the
// shared maps, the node's endpoint programs, the drop-notification reader
// and what is realised per endpoint.
type bpfState struct {
	dir    string // LinuxConfig.BPFFS
	tmpl   *template
	maps   sharedMaps
	progs  programs          // the node's endpoint programs (nodePrograms)
	progID [2]ebpf.ProgramID // their kernel IDs (from, to)
	events *ringbuf.Reader
	flows  *ringbuf.Reader // the flow reports (bpf_flows_linux.go)
	slots  slotPool        // the outer maps' slots (bpf_slots_linux.go)

	// mu guards everything below.
	mu sync.Mutex
	// epLegacy: new endpoints attach with clsact + cls_bpf (the default,
	// or TCX missing); devLegacy: so do the shared devices (uplinks,
	// tunnel device) (forced, or TCX missing).
	epLegacy, devLegacy bool
	eps                 map[endpoint.ID]*bpfEndpoint
	// host is the host endpoint's maps (bpf_hostfw_linux.go; nil until
	// its first RealizeHostPolicy).
	host *bpfEndpoint
	// prep holds the Prepares that run and the endpoints whose Realize
	// runs (bpf_prepare_linux.go).
	prep map[endpoint.ID]*prepared
	// held are the shared devices' and the cgroup's links by pin path,
	// mapPins the other pinned maps the pin check repairs
	// (bpf_held_linux.go).
	held    map[string]link.Link
	mapPins map[string]*ebpf.Map
}

// bpfEndpoint is what is realised for one endpoint. The agent never runs
// two operations on one endpoint at once, so its fields need no lock.
// Only the policy maps' file descriptors are kept (two per endpoint):
// the outer maps, the pinned TCX links or the cls_bpf filters hold the
// rest.
type bpfEndpoint struct {
	policyMap *ebpf.Map
	cidrMap   *ebpf.Map
	slot      uint32 // their key in the outer maps
	// staleSlot is the slot a previous agent's endpoints entry named
	// without holding these maps (reopenEndpointMaps); released once the
	// entry names slot.
	staleSlot uint32
	// have is what the policy map enforces (never nil), ports the
	// proxy ports of its redirected entries.
	have  *policy.MapState
	ports map[policy.Key]uint16
	// attached: the node's programs run on ifindex (with cls_bpf
	// filters when legacy, else TCX links); identity and addrs are what
	// the endpoints map says for ifindex.
	attached bool
	identity identity.NumericIdentity
	addrs    epAddrs
	audit    bool // the entry's ENDPOINT_F_AUDIT
	// enf: the entry's ENDPOINT_F_ENFORCE_* flags (enforceFlags), kept
	// a superset of the directions the policy map enforces.
	enf     uint32
	ifindex int
	legacy  bool
	// links are the endpoint's TCX links (from, to; nil: legacy, or not
	// attached yet), held open besides their pins: a pin removed under
	// the agent (rm -rf of the bpffs directory) would otherwise release
	// the last reference and detach the programs, leaving the pod's
	// traffic unfiltered. Closing them detaches nothing while pinned.
	links [2]link.Link
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
	e.closeLinks()
}

// closeLinks closes the held TCX links (their pins keep them attached).
func (e *bpfEndpoint) closeLinks() {
	for i, lk := range e.links {
		if lk != nil {
			lk.Close()
			e.links[i] = nil
		}
	}
}

// openBPF mounts the bpffs if needed, parses the template, opens the
// shared maps, the node's endpoint programs (loading them unless this
// build's are pinned) and the drop-notification reader.
func openBPF(cfg LinuxConfig) (b *bpfState, retErr error) {
	if err := ensureBPFFS(cfg.BPFFS); err != nil {
		return nil, err
	}
	tmpl, err := newTemplate(cfg.Maps.withDefaults())
	if err != nil {
		return nil, err
	}
	sm, err := tmpl.openShared(cfg.BPFFS)
	if err != nil {
		return nil, err
	}
	b = &bpfState{dir: cfg.BPFFS, tmpl: tmpl, maps: sm,
		epLegacy: cfg.ForceLegacyTC || !cfg.EndpointTCX, devLegacy: cfg.ForceLegacyTC,
		eps: map[endpoint.ID]*bpfEndpoint{}, prep: map[endpoint.ID]*prepared{}}
	st := b
	defer func() {
		if retErr != nil {
			st.progs.close() // st: b is nil once an error is returned
			sm.close()
		}
	}()
	if cfg.Nodes.Routing == RoutingTunnel {
		// From the start, not from the first SyncNodes: a previous
		// agent's tunnel device may be up already.
		if err := setTunnelPort(b, cfg.Nodes.TunnelPort); err != nil {
			return nil, err
		}
	}
	// Before any program runs: a pod the ipcache had no room for is
	// unknown, never world.
	if err := setPodCIDRs(b, slices.Concat(cfg.Nodes.LocalPodCIDRs, cfg.Nodes.ClusterCIDRs)); err != nil {
		return nil, err
	}
	if b.progs, err = b.nodePrograms(); err != nil {
		return nil, err
	}
	if b.progID, err = b.progs.ids(); err != nil {
		return nil, err
	}
	if err := b.setFlows(cfg.Flows); err != nil {
		return nil, err
	}
	if b.events, err = ringbuf.NewReader(sm.events); err != nil {
		return nil, fmt.Errorf("open drop notification reader: %w", err)
	}
	if b.flows, err = ringbuf.NewReader(sm.flows); err != nil {
		b.events.Close()
		return nil, fmt.Errorf("open flow report reader: %w", err)
	}
	if err := b.initSlots(); err != nil {
		b.events.Close()
		b.flows.Close()
		b.closeSlots()
		return nil, err
	}
	return b, nil
}

// close releases the file descriptors; pinned objects (and with them the
// programs attached to the endpoints) stay.
func (b *bpfState) close() {
	b.events.Close()
	b.flows.Close()
	b.mu.Lock()
	for _, e := range b.eps {
		e.close()
	}
	b.eps = map[endpoint.ID]*bpfEndpoint{}
	if b.host != nil {
		b.host.close()
		b.host = nil
	}
	b.closeHeldLocked()
	prep := b.prep
	b.prep = map[endpoint.ID]*prepared{}
	b.mu.Unlock()
	for _, p := range prep {
		<-p.done
	}
	b.closeSlots()
	b.progs.close()
	b.maps.close()
}

// realizeBPF makes the node's endpoint programs run on ifindex for
// endpoint ep, enforcing ep.Policy. A policy-only change updates the
// policy map by difference; a new identity rewrites the endpoint's
// entry in the endpoints map; a first realise (also after an agent
// restart, when the pinned policy maps are read back) or a new interface
// writes the entry and attaches the programs (or updates the attachment
// in place). Nothing is loaded: the programs are the node's.
func (l *Linux) realizeBPF(ep *endpoint.Endpoint, ifindex int) error {
	b := l.bpf
	start := time.Now()
	b.claim(ep.ID)
	defer b.release(ep.ID)
	l.phase(PhaseBPFClaim, start)
	b.mu.Lock()
	e := b.eps[ep.ID]
	b.mu.Unlock()
	dir := b.endpointDir(ep.ID)
	start = time.Now()
	if e == nil {
		var err error
		if e, err = l.openEndpoint(ep, dir, ifindex); err != nil {
			return err
		}
		l.phase(PhaseBPFMaps, start)
		start = time.Now()
	}
	// The entry says a direction may be enforced before the sync writes
	// its enforce entry, which the programs would not look up otherwise
	// (failClosed raises both itself).
	if !e.attached {
		// A previous agent's entry, whatever it says: both.
		if err := b.raiseEnforceFlags(ep.ID, ifindex); err != nil {
			return err
		}
	} else if want := enforceFlags(ep.Policy); want&^e.enf != 0 {
		if err := l.writeEndpointInfo(e, ep.ID, e.identity, e.addrs, e.audit, e.enf|want); err != nil {
			return err
		}
	}
	if err := l.syncEndpointPolicy(e, ep); err != nil {
		return err
	}
	l.phase(PhaseBPFPolicy, start)
	addrs := addrsOf(ep)
	enf := enforceFlags(e.have)
	if e.attached && e.identity == ep.Identity && e.addrs == addrs && e.audit == ep.PolicyAudit && e.ifindex == ifindex &&
		e.enf == enf {
		return nil
	}
	start = time.Now()
	// One map write: the entry carries the addresses the programs hold
	// the pod's packets to (bpf/endpoint.c, source_ok) and the audit mode.
	info := endpointInfo(ep.ID, ep.Identity, e.slot, addrs)
	if ep.PolicyAudit {
		info.Flags |= endpointFlagAudit
	}
	info.Flags |= enf
	if err := b.setEndpointInfo(info, ifindex, e.ifindex); err != nil {
		return err
	}
	e.enf = enf
	if e.staleSlot != 0 {
		if err := l.releaseStaleSlot(e.staleSlot); err != nil {
			return err
		}
		e.staleSlot = 0
	}
	l.phase(PhaseBPFLoad, start)
	if e.attached && e.ifindex == ifindex {
		e.identity, e.addrs, e.audit = ep.Identity, addrs, ep.PolicyAudit // the entry was all there was to change
		return nil
	}
	start = time.Now()
	e.attached = false
	if err := l.attach(e, dir, ifindex); err != nil {
		return err
	}
	l.phase(PhaseBPFAttach, start)
	e.attached, e.identity, e.addrs, e.audit, e.ifindex = true, ep.Identity, addrs, ep.PolicyAudit, ifindex
	return nil
}

// writeEndpointInfo rewrites e's endpoints entry as it is but for the
// enforce flags enf.
func (l *Linux) writeEndpointInfo(e *bpfEndpoint, id endpoint.ID, ident identity.NumericIdentity, addrs epAddrs, audit bool, enf uint32) error {
	info := endpointInfo(id, ident, e.slot, addrs)
	if audit {
		info.Flags |= endpointFlagAudit
	}
	info.Flags |= enf
	if err := l.bpf.setEndpointInfo(info, e.ifindex, 0); err != nil {
		return err
	}
	e.enf = enf
	return nil
}

// syncEndpointPolicy writes the difference between what e's policy maps
// hold and ep.Policy: when ep.Policy was patched from the policy they
// hold (policy.MapState.PatchedFrom: a DNS answer's new address), the
// entries of the patched peers alone (syncPatch), else a diff of the
// whole maps. It fails closed: a policy that does not fit the
// maps (ErrMapFull), or a write that fails halfway, leaves the endpoint
// enforcing deny-all (failClosed), never its previous policy nor a mix
// of both, which may allow what the new policy denies.
func (l *Linux) syncEndpointPolicy(e *bpfEndpoint, ep *endpoint.Endpoint) error {
	b := l.bpf
	want := ep.Policy
	if want == nil {
		want = noPolicy
	}
	if err := b.policyFits(want); err != nil {
		l.mapFull.add(mapPolicy)
		if ferr := l.failClosed(e, ep.ID); ferr != nil {
			return errors.Join(err, ferr)
		}
		return fmt.Errorf("%w; failed closed: every new connection denied", err)
	}
	var err error
	if peers, ok := want.PatchedFrom(e.have); ok {
		// Only the entries of peers changed (a DNS answer's new
		// address): only they are written.
		var ports map[policy.Key]uint16
		ports, err = syncPatch(e.policyMap, policyTarget{e.have, e.ports}, want, peers, l.proxyPorts())
		switch {
		case err == nil:
			e.have, e.ports = want, ports
			return nil
		case errors.Is(err, policy.ErrNoProxy):
			return fmt.Errorf("endpoint %d: %w: %w", ep.ID, err, ErrNotSupported)
		}
		// Partly applied: below, from what the maps hold.
	}
	ports, perr := want.Redirects(l.proxyPorts())
	if perr != nil {
		return fmt.Errorf("endpoint %d: %w: %w", ep.ID, perr, ErrNotSupported)
	}
	if err == nil {
		err = syncPolicyMap(e.policyMap, e.cidrMap, policyTarget{e.have, e.ports}, policyTarget{want, ports})
		if err == nil {
			e.have, e.ports = want, ports
			return nil
		}
	}
	// Partly applied: read back what the maps hold now, then deny-all.
	if have, hports, rerr := realisedState(e.policyMap, e.cidrMap); rerr == nil {
		e.have, e.ports = have, hports
	}
	if ferr := l.failClosed(e, ep.ID); ferr != nil || !mapFullErr(err) {
		return errors.Join(err, ferr)
	}
	// The old entries and the new did not fit together (the additions
	// come before the removals, for the connections both allow): from
	// deny-all, the new policy alone fits.
	if err := syncPolicyMap(e.policyMap, e.cidrMap, policyTarget{e.have, e.ports}, policyTarget{want, ports}); err != nil {
		l.mapFull.add(mapPolicy)
		if have, hports, rerr := realisedState(e.policyMap, e.cidrMap); rerr == nil {
			e.have, e.ports = have, hports
		}
		if ferr := l.failClosed(e, ep.ID); ferr != nil {
			return errors.Join(err, ferr)
		}
		return fmt.Errorf("%w; failed closed: every new connection denied", err)
	}
	e.have, e.ports = want, ports
	return nil
}

// openEndpoint opens endpoint ep's policy maps: a new endpoint takes a
// filled slot (bpf_slots_linux.go) and pins its maps under dir; a
// previous agent's endpoint has them pinned there already, and they are
// read back and found in (or written to) a slot. When a previous agent
// left the node's current programs attached to ifindex for this
// endpoint (adopt), nothing is attached again.
func (l *Linux) openEndpoint(ep *endpoint.Endpoint, dir string, ifindex int) (*bpfEndpoint, error) {
	b := l.bpf
	_, statErr := os.Stat(dir)
	existed := statErr == nil // a previous agent's endpoint
	pm, cm := loadEndpointMaps(b.tmpl, dir)
	var e *bpfEndpoint
	var err error
	if pm == nil && cm == nil {
		e, err = b.newEndpointMaps(dir)
	} else {
		e, err = b.reopenEndpointMaps(ep.ID, dir, ifindex, pm, cm)
	}
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	e.legacy = b.epLegacy
	b.mu.Unlock()
	if ifindex != 0 && existed {
		// Only a previous agent's endpoint can have programs attached
		// (a new one's ADD is spared the netlink queries).
		l.adopt(e, ep.ID, dir, ifindex)
	}
	b.mu.Lock()
	b.eps[ep.ID] = e
	b.mu.Unlock()
	return e, nil
}

// loadEndpointMaps opens the policy maps pinned in dir that have this
// build's layout (nil where none is).
func loadEndpointMaps(t *template, dir string) (pm, cm *ebpf.Map) {
	load := func(spec *ebpf.MapSpec, pin string) *ebpf.Map {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, pin), nil)
		if err != nil {
			return nil
		}
		if spec.Compatible(m) != nil {
			m.Close()
			return nil
		}
		return m
	}
	return load(t.policySpec(), pinPolicy), load(t.cidrSpec(), pinCIDR)
}

// newEndpointMaps gives a new endpoint a filled slot, its maps pinned in
// dir.
func (b *bpfState) newEndpointMaps(dir string) (*bpfEndpoint, error) {
	s, err := b.takeSlot()
	if err != nil {
		return nil, err
	}
	e := &bpfEndpoint{policyMap: s.pm, cidrMap: s.cm, slot: s.n, have: noPolicy}
	if err := pinEndpointMaps(dir, s.pm, s.cm); err != nil {
		e.close()
		_ = b.releaseSlot(s.n)
		return nil, err
	}
	return e, nil
}

// pinEndpointMaps pins pm and cm in dir.
func pinEndpointMaps(dir string, pm, cm *ebpf.Map) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	for pin, m := range map[string]*ebpf.Map{pinPolicy: pm, pinCIDR: cm} {
		path := filepath.Join(dir, pin)
		if err := unpin(path); err != nil {
			return err
		}
		if err := m.Pin(path); err != nil {
			return fmt.Errorf("pin %s map %s: %w", pin, path, err)
		}
	}
	return nil
}

// reopenEndpointMaps takes a previous agent's maps pinned in dir (making
// the one missing, as an older build leaves it), reads back what they
// enforce and finds their slot.
func (b *bpfState) reopenEndpointMaps(id endpoint.ID, dir string, ifindex int, pm, cm *ebpf.Map) (*bpfEndpoint, error) {
	var err error
	e := &bpfEndpoint{policyMap: pm, cidrMap: cm, have: noPolicy}
	if pm == nil {
		e.policyMap, _, err = openEndpointMap(b.tmpl.policySpec(), dir, pinPolicy)
	} else if cm == nil {
		e.cidrMap, _, err = openEndpointMap(b.tmpl.cidrSpec(), dir, pinCIDR)
	}
	if err != nil {
		e.close()
		return nil, err
	}
	if e.have, e.ports, err = realisedState(e.policyMap, e.cidrMap); err != nil {
		e.close()
		return nil, err
	}
	if e.slot, e.staleSlot, err = b.endpointSlot(uint32(id), ifindex, e.policyMap, e.cidrMap); err != nil {
		e.close()
		return nil, fmt.Errorf("endpoint %d: %w", id, err)
	}
	return e, nil
}

// setEndpointInfo writes an endpoint's entry v (endpointInfo: its
// identity, slot and addresses) for ifindex and deletes the one of its
// previous interface old (0: none).
func (b *bpfState) setEndpointInfo(v bpf.EndpointEndpointInfo, ifindex, old int) error {
	id := endpoint.ID(v.Id)
	if err := b.maps.endpoints.Update(uint32(ifindex), v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("endpoint %d: endpoints entry of ifindex %d: %w", id, ifindex, err)
	}
	if old != 0 && old != ifindex {
		return b.deleteEndpointInfo(id, old)
	}
	return nil
}

// raiseEnforceFlags makes the endpoints entry of ifindex, if it is
// endpoint id's and carries ENDPOINT_F_ENFORCE_KNOWN, say that both
// directions may be enforced (before its policy map is synced).
func (b *bpfState) raiseEnforceFlags(id endpoint.ID, ifindex int) error {
	var v bpf.EndpointEndpointInfo
	if err := b.maps.endpoints.Lookup(uint32(ifindex), &v); err != nil || v.Id != uint32(id) ||
		v.Flags&endpointFlagEnforceKnown == 0 || v.Flags&endpointFlagsEnforce == endpointFlagsEnforce {
		return nil
	}
	v.Flags |= endpointFlagsEnforce
	if err := b.maps.endpoints.Update(uint32(ifindex), v, ebpf.UpdateExist); err != nil {
		return fmt.Errorf("endpoint %d: endpoints entry of ifindex %d: %w", id, ifindex, err)
	}
	return nil
}

// deleteEndpointInfo deletes the entry of ifindex if it is endpoint id's.
func (b *bpfState) deleteEndpointInfo(id endpoint.ID, ifindex int) error {
	var v bpf.EndpointEndpointInfo
	if err := b.maps.endpoints.Lookup(uint32(ifindex), &v); err != nil || v.Id != uint32(id) {
		return nil
	}
	if err := b.maps.endpoints.Delete(uint32(ifindex)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("endpoint %d: delete endpoints entry of ifindex %d: %w", id, ifindex, err)
	}
	return nil
}

// forgetEndpoint deletes every endpoints entry naming endpoint id and
// empties their slots but released (emptied by the caller already: a
// slot is emptied once, its number may be in use again right after); for
// an endpoint this agent never realised (GC of an orphan pin directory,
// the Remove of one unknown since a restart).
func (b *bpfState) forgetEndpoint(id endpoint.ID, released uint32) error {
	var k uint32
	var v bpf.EndpointEndpointInfo
	stale := map[uint32]uint32{}
	it := b.maps.endpoints.Iterate()
	for it.Next(&k, &v) {
		if v.Id == uint32(id) {
			stale[k] = v.Slot
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("endpoint %d: read endpoints map: %w", id, err)
	}
	var errs []error
	for k, n := range stale {
		if err := b.maps.endpoints.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("endpoint %d: delete endpoints entry of ifindex %d: %w", id, k, err))
		}
		if n != 0 && n != released {
			errs = append(errs, b.releaseSlot(n))
		}
	}
	return errors.Join(errs...)
}

// attach runs the node's programs on ifindex for e: with TCX links
// (updated in place when pinned) or, for a legacy endpoint, cls_bpf
// filters (replaced in place). An endpoint keeps the mode it was first
// attached with; where the kernel lacks TCX, TCX endpoints fall back.
func (l *Linux) attach(e *bpfEndpoint, dir string, ifindex int) error {
	progs := [2]*ebpf.Program{l.bpf.progs.from, l.bpf.progs.to}
	b := l.bpf
	for i := 0; i < len(hooks) && !e.legacy; i++ {
		lk, err := attachTCX(dir, hooks[i], ifindex, progs[i], l.inHost)
		if errors.Is(err, ebpf.ErrNotSupported) {
			l.log.Warn("kernel has no TCX: attaching endpoint programs with clsact + cls_bpf", "err", err)
			b.mu.Lock()
			b.epLegacy, b.devLegacy = true, true
			b.mu.Unlock()
			e.legacy = true
			break
		}
		if err != nil {
			return err
		}
		b.mu.Lock() // the pin check reads (and pins) the links under b.mu
		old := e.links[i]
		e.links[i] = lk // held besides the pin (bpfEndpoint.links)
		b.mu.Unlock()
		if old != nil {
			old.Close() // a previous object of the same or a replaced link; lk is pinned
		}
	}
	if !e.legacy {
		return nil
	}
	if e.ifindex != 0 && e.ifindex != ifindex { // moved: off the old interface
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
	return nil
}

// removeBPF detaches endpoint id's programs from ifindex (0: unknown,
// the filters die with the interface), deletes its endpoints entry and
// unpins its objects. cls_bpf filters go first, so that no packet of the
// interface finds its entry gone; closing TCX links (which detaches them
// and waits for an RCU grace period) and emptying the endpoint's slot
// from the outer maps (which waits for one too) are left to the worker
// pool; until the links are closed the interface's packets are dropped
// as no-endpoint. Removing a missing endpoint is success.
func (l *Linux) removeBPF(id endpoint.ID, ifindex int) error {
	b := l.bpf
	b.dropPrepared(id)
	b.mu.Lock()
	e := b.eps[id]
	delete(b.eps, id)
	b.mu.Unlock()
	dir := b.endpointDir(id)
	legacy := true // unknown: a previous agent's filters may be there
	if e != nil {
		legacy = e.legacy
		if ifindex == 0 {
			ifindex = e.ifindex
		}
		e.close() // the slot (emptied below) holds the maps meanwhile
	}
	var closers []io.Closer
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
	release, err := b.removeEntries(id, ifindex, e)
	if err != nil {
		return err
	}
	if release != nil {
		closers = append(closers, release)
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

// removeEntries deletes endpoint id's endpoints entry (its ifindex's:
// ifindex, or e's) and returns its slot's release, for closeLater; for
// an endpoint this agent never realised, every entry naming it (and
// their slots, emptied at once).
func (b *bpfState) removeEntries(id endpoint.ID, ifindex int, e *bpfEndpoint) (io.Closer, error) {
	if e == nil {
		return nil, b.forgetEndpoint(id, 0)
	}
	for _, i := range []int{ifindex, e.ifindex} {
		if i != 0 {
			if err := b.deleteEndpointInfo(id, i); err != nil {
				return nil, err
			}
		}
	}
	return slotRelease{b, e.slot}, nil
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
