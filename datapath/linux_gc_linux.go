package datapath

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/ifname"
)

// endpointPinDir is the directory under LinuxConfig.BPFFS that holds one
// directory of pinned objects per endpoint, named by its ID.
const endpointPinDir = "endpoints"

// linuxGC is the two-pass bookkeeping of Linux.GC.
type linuxGC struct {
	// mu serialises passes and guards the sweeps.
	mu      sync.Mutex
	links   sweep[string]      // orphan host veths, "name/index"
	pins    sweep[string]      // orphan pin directories, by name
	missing sweep[endpoint.ID] // live endpoints without host interface
}

// GC implements Collector. One pass lists the host netns's links once and
//   - reports live endpoints whose host interface (by index and name, or
//     by name) was missing in this pass and the previous one;
//   - deletes lxc* veths that belong to no live endpoint (by name or
//     index) and were orphaned in the previous pass too, with the same
//     index (a re-created veth starts over);
//   - defers the deletion of tombstone veths no teardown is pending for
//     (an agent killed between a removal and its deletion), at once;
//   - removes <BPFFS>/endpoints/<name> directories whose name is not a
//     live endpoint's ID and were orphaned in the previous pass too.
//
// Veths whose deferred teardown is pending are left to it.
func (l *Linux) GC(ctx context.Context, live []*endpoint.Endpoint) (r GCReport, err error) {
	err = l.guard(func() error {
		r, err = l.gcPass(live)
		return err
	})
	return r, err
}

// dumpRetries bounds the link dumps of one pass: a dump that links
// changed under (netlink.ErrDumpInterrupted, common while pods come and
// go) is partial and must not be trusted, so it is taken again.
const dumpRetries = 5

// listLinks dumps the host's links, again when the dump was interrupted.
func (l *Linux) listLinks() ([]netlink.Link, error) {
	for i := 0; ; i++ {
		links, err := l.nl.LinkList()
		if !errors.Is(err, netlink.ErrDumpInterrupted) || i == dumpRetries {
			return links, err
		}
	}
}

func (l *Linux) gcPass(live []*endpoint.Endpoint) (GCReport, error) {
	l.gc.mu.Lock()
	defer l.gc.mu.Unlock()
	links, err := l.listLinks()
	if err != nil {
		return GCReport{}, fmt.Errorf("gc: list links: %w", err)
	}
	var r GCReport
	var suspects int
	r.Missing, suspects = l.gc.missing.pass(missingEndpoints(live, links))
	r.Suspects += suspects
	orphans := l.orphanVeths(live, links)
	confirmed, suspects := l.gc.links.pass(orphans)
	r.Suspects += suspects
	var errs []error
	for _, key := range confirmed {
		name, idx := splitLinkKey(key)
		if err := l.deleteLink(idx, name); err != nil {
			errs = append(errs, err)
			continue
		}
		r.Links = append(r.Links, name)
	}
	n, err := l.sweepTombstones(links)
	r.Tombstones = n
	if err != nil {
		errs = append(errs, fmt.Errorf("gc: %w", err))
	}
	pins, err := l.orphanPins(live)
	if err != nil {
		errs = append(errs, err)
	}
	confirmed, suspects = l.gc.pins.pass(pins)
	r.Suspects += suspects
	for _, name := range confirmed {
		dir := filepath.Join(l.cfg.BPFFS, endpointPinDir, name)
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("gc: remove pins %s: %w", dir, err))
			continue
		}
		r.Pins = append(r.Pins, dir)
		if err := l.forgetEndpointState(name); err != nil {
			errs = append(errs, fmt.Errorf("gc: %w", err))
		}
	}
	if !r.Empty() {
		l.log.Info("datapath gc pass", "links-deleted", r.Links, "tombstones", r.Tombstones, "pins-removed", r.Pins,
			"suspects", r.Suspects, "missing-endpoints", r.Missing)
	}
	return r, errors.Join(errs...)
}

// missingEndpoints returns the live endpoints with a host interface that
// links do not hold (by index with the same name, or by name).
func missingEndpoints(live []*endpoint.Endpoint, links []netlink.Link) []endpoint.ID {
	byIndex := make(map[int]string, len(links))
	byName := make(map[string]bool, len(links))
	for _, link := range links {
		byIndex[link.Attrs().Index] = link.Attrs().Name
		byName[link.Attrs().Name] = true
	}
	var missing []endpoint.ID
	for _, ep := range live {
		switch {
		case ep.IfIndex == 0 && ep.IfName == "":
			continue
		case ep.IfIndex != 0:
			if name, ok := byIndex[ep.IfIndex]; ok && (ep.IfName == "" || name == ep.IfName) {
				continue
			}
		case byName[ep.IfName]:
			continue
		}
		missing = append(missing, ep.ID)
	}
	return missing
}

// orphanVeths returns the lxc* veths no live endpoint names (by name or
// index) and no pending teardown will delete, as "name/index" keys.
func (l *Linux) orphanVeths(live []*endpoint.Endpoint, links []netlink.Link) []string {
	names := make(map[string]bool, len(live))
	indexes := make(map[int]bool, len(live))
	for _, ep := range live {
		names[ep.IfName] = true
		indexes[ep.IfIndex] = true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var orphans []string
	for _, link := range links {
		a := link.Attrs()
		if link.Type() != "veth" || !ifname.ValidHost(a.Name) || names[a.Name] || indexes[a.Index] {
			continue
		}
		if _, pending := l.pending[a.Index]; pending {
			continue
		}
		orphans = append(orphans, a.Name+"/"+strconv.Itoa(a.Index))
	}
	return orphans
}

func splitLinkKey(key string) (name string, index int) {
	i := strings.LastIndexByte(key, '/')
	index, _ = strconv.Atoi(key[i+1:])
	return key[:i], index
}

// orphanPins returns the directories under <BPFFS>/endpoints whose name is
// not a live endpoint's ID. A missing directory holds no orphans.
func (l *Linux) orphanPins(live []*endpoint.Endpoint) ([]string, error) {
	dir := filepath.Join(l.cfg.BPFFS, endpointPinDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("gc: list pins: %w", err)
	}
	ids := make(map[string]bool, len(live))
	for _, ep := range live {
		ids[strconv.Itoa(int(ep.ID))] = true
	}
	var orphans []string
	for _, e := range entries {
		if e.IsDir() && !ids[e.Name()] {
			orphans = append(orphans, e.Name())
		}
	}
	return orphans, nil
}

// forgetEndpointState drops the shared-map state (outer map and
// endpoints entries, conntrack entries, drop counters) of the endpoint
// whose orphan pin directory is name.
func (l *Linux) forgetEndpointState(name string) error {
	n, err := strconv.ParseUint(name, 10, 16)
	if err != nil {
		return nil // not an endpoint directory
	}
	id := endpoint.ID(n)
	return l.guardBPF(func(b *bpfState) error {
		// What a Prepare that ran after the endpoint's removal opened
		// (bpf_prepare_linux.go).
		b.dropPrepared(id)
		b.mu.Lock()
		e := b.eps[id]
		delete(b.eps, id)
		b.mu.Unlock()
		var released uint32
		if e != nil {
			e.close()
			if err := b.releaseSlot(e.slot); err != nil {
				return err
			}
			released = e.slot
		}
		if err := b.forgetEndpoint(id, released); err != nil {
			return err
		}
		if err := deleteDropCounters(b.maps.drops, id); err != nil {
			return err
		}
		_, err := flushConntrack(b.maps.ct, id)
		return err
	})
}
