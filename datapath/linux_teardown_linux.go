package datapath

import (
	"context"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/pkg/domain/ifname"
)

// A removed endpoint's host veth is taken out of service at once and
// deleted later. tombstone sets it down (the pod end loses its carrier:
// nothing passes either way, and dev_close waits for the packets in
// flight) and renames it to ifname.Tombstone(index), so the attachment's
// host name is free for the next ADD. The pair's deletion (an RCU
// barrier, ~25-30 ms) is deferred by TeardownDelay and runs in the worker
// pool; the runtime usually deletes the pod's netns first, which removes
// the pair in the kernel's own batch. At most MaxPendingTeardowns wait;
// past that a removal deletes the pair at once. A tombstone nobody is
// waiting to delete (the agent was killed in between) is found by Init
// and by every GC pass, and deleted the same way.

// teardown is a deferred deletion of a host veth.
type teardown struct {
	index int
	name  string
	timer *time.Timer
}

// tombstone sets the host veth h down and renames it to its tombstone;
// it returns the name it has now. A veth already renamed is left as it
// is; gone, or an index that now names another interface, is ("", nil).
func (l *Linux) tombstone(h hostLink) (string, error) {
	link, err := l.nl.LinkByIndex(h.index)
	if isLinkNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("tombstone host veth %s: %w", h.name, err)
	}
	tomb := ifname.Tombstone(h.index)
	name := link.Attrs().Name
	switch {
	case link.Type() != "veth":
		return "", nil
	case name == tomb:
		return tomb, nil // a removal retried, or restored after a crash
	case h.name != "" && name != h.name:
		return "", nil // the index was reused by another interface
	case !ifname.Managed(name):
		return "", nil
	}
	if err := l.nl.LinkSetDown(link); err != nil {
		if isLinkNotFound(err) {
			return "", nil
		}
		return "", fmt.Errorf("tombstone host veth %s: set down: %w", name, err)
	}
	if err := l.nl.LinkSetName(link, tomb); err != nil {
		if isLinkNotFound(err) {
			return "", nil
		}
		return name, fmt.Errorf("tombstone host veth %s: rename to %s: %w", name, tomb, err)
	}
	return tomb, nil
}

// deferDelete schedules the deletion of the host veth (index, name)
// after TeardownDelay, or deletes it now when MaxPendingTeardowns are
// pending (or the datapath is closing). Deleting now happens on the
// caller's path: the pool's, never an actor's.
func (l *Linux) deferDelete(index int, name string) error {
	if l.scheduleTeardown(index, name) {
		return nil
	}
	l.mu.Lock()
	l.teardownsSync++
	l.mu.Unlock()
	return l.deleteLink(index, name)
}

// scheduleTeardown deletes the host veth after TeardownDelay, in the
// worker pool (or on the timer goroutine before SetHooks), unless it is
// gone by then. One pending teardown per interface index. It reports
// false when the veth was not scheduled: MaxPendingTeardowns are pending,
// or Close ran the pending teardowns.
func (l *Linux) scheduleTeardown(index int, name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	if _, ok := l.pending[index]; ok && index != 0 {
		return true
	}
	if len(l.pending) >= l.cfg.MaxPendingTeardowns {
		return false
	}
	t := &teardown{index: index, name: name}
	t.timer = time.AfterFunc(l.cfg.TeardownDelay, func() { l.runTeardown(t) })
	l.pending[index] = t
	return true
}

// runTeardown submits t's deletion to the pool; it stays pending (so GC
// leaves it alone and it counts against the bound) until it ran.
func (l *Linux) runTeardown(t *teardown) {
	l.submit("teardown", func(context.Context) error {
		defer func() {
			l.mu.Lock()
			if l.pending[t.index] == t {
				delete(l.pending, t.index)
			}
			l.mu.Unlock()
		}()
		return l.deleteLink(t.index, t.name)
	})
}

// deleteLink deletes the host veth (and with it its peer) if index still
// names it and it is a veth the agent manages (ifname.Managed) or a
// tombstone; gone is success.
func (l *Linux) deleteLink(index int, name string) error {
	var link netlink.Link
	var err error
	if index != 0 {
		link, err = l.nl.LinkByIndex(index)
	} else {
		link, err = l.nl.LinkByName(name)
	}
	if isLinkNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete host veth %s: %w", name, err)
	}
	if name != "" && link.Attrs().Name != name {
		return nil // the index was reused by another interface
	}
	if n := link.Attrs().Name; link.Type() != "veth" || !(ifname.Managed(n) || ifname.IsTombstone(n)) {
		return nil // membrane creates only veths of its names; this one is not ours
	}
	if err := l.nl.LinkDel(link); err != nil && !isLinkNotFound(err) {
		return fmt.Errorf("delete host veth %s: %w", name, err)
	}
	l.log.Debug("host veth deleted", "interface", name)
	return nil
}

// sweepTombstones defers the deletion of every tombstone veth in links
// that no teardown is pending for: left by an agent killed between a
// removal and its deferred deletion. A tombstone belongs to no endpoint
// (its endpoint's removal made it), so one sighting is enough.
func (l *Linux) sweepTombstones(links []netlink.Link) (n int, err error) {
	for _, link := range links {
		a := link.Attrs()
		// Only a name that encodes the veth's own index is the agent's:
		// another program's veth named like one is left alone.
		if link.Type() != "veth" || !ifname.IsTombstoneOf(a.Name, a.Index) {
			continue
		}
		l.mu.Lock()
		_, pending := l.pending[a.Index]
		l.mu.Unlock()
		if pending {
			continue
		}
		if e := l.deferDelete(a.Index, a.Name); e != nil && err == nil {
			err = e
		}
		n++
	}
	return n, err
}

// Teardowns is what Linux.Teardowns reports.
type Teardowns struct {
	// Pending is the host veths whose deferred deletion has not run yet.
	Pending int
	// Max is LinuxConfig.MaxPendingTeardowns.
	Max int
	// Sync counts the host veths deleted at once because Max were
	// pending (or the datapath was closing), since start.
	Sync uint64
}

// Teardowns reports the deferred host veth deletions.
func (l *Linux) Teardowns() Teardowns {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Teardowns{Pending: len(l.pending), Max: l.cfg.MaxPendingTeardowns, Sync: l.teardownsSync}
}

// PendingTeardowns reports how many host veth deletions are scheduled.
func (l *Linux) PendingTeardowns() int { return l.Teardowns().Pending }
