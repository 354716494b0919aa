package datapath

import (
	"context"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/pkg/domain/ifname"
)

// teardown is a deferred deletion of a host veth.
type teardown struct {
	index int
	name  string
	timer *time.Timer
}

// scheduleTeardown deletes the host veth after TeardownDelay, in the
// worker pool (or on the timer goroutine before SetHooks), unless it is
// gone by then. One pending teardown per interface index.
func (l *Linux) scheduleTeardown(index int, name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return // Close ran the pending teardowns; this one dies with its netns
	}
	if _, ok := l.pending[index]; ok && index != 0 {
		return
	}
	t := &teardown{index: index, name: name}
	t.timer = time.AfterFunc(l.cfg.TeardownDelay, func() { l.runTeardown(t) })
	l.pending[index] = t
}

func (l *Linux) runTeardown(t *teardown) {
	l.mu.Lock()
	if l.pending[t.index] == t {
		delete(l.pending, t.index)
	}
	l.mu.Unlock()
	l.submit("teardown", func(context.Context) error { return l.deleteLink(t.index, t.name) })
}

// deleteLink deletes the host veth (and with it its peer) if index still
// names it and it is a veth the agent manages (ifname.Managed); gone is
// success.
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
	if link.Type() != "veth" || !ifname.Managed(link.Attrs().Name) {
		return nil // membrane creates only veths of its names; this one is not ours
	}
	if err := l.nl.LinkDel(link); err != nil && !isLinkNotFound(err) {
		return fmt.Errorf("delete host veth %s: %w", name, err)
	}
	l.log.Debug("host veth deleted", "interface", name)
	return nil
}

// PendingTeardowns reports how many host veth deletions are scheduled.
func (l *Linux) PendingTeardowns() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.pending)
}
