package datapath

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// WatchHostAddrs follows the host netns's addresses (netlink address
// notifications): fn gets the global unicast ones (HostAddrs' filter)
// present when the subscription starts, then every one added or removed,
// until ctx ends or the datapath closes. fn is called on the watcher's
// goroutine and must not block (the agent turns each call into a message
// to the ipcache actor). After a lost subscription (a full socket buffer
// drops notifications) it subscribes again and fn gets the present
// addresses again; a removal inside the gap is not reported. Returns
// ErrClosed if the datapath is not open.
func (l *Linux) WatchHostAddrs(ctx context.Context, fn func(HostAddrChange)) error {
	var ns *netns.NsHandle
	err := l.guard(func() error {
		if l.ns != nil {
			h, err := netns.GetFromPath(l.cfg.HostNetns)
			if err != nil {
				return fmt.Errorf("watch host addresses: open %s: %w", l.cfg.HostNetns, err)
			}
			ns = &h
		}
		return nil
	})
	if err != nil {
		return err
	}
	ch, done, err := l.subscribeAddrs(ns)
	if err != nil {
		if ns != nil {
			ns.Close()
		}
		return err
	}
	go l.watchAddrs(ctx, ns, ch, done, fn)
	return nil
}

// subscribeAddrs starts one subscription that first lists the present
// addresses.
func (l *Linux) subscribeAddrs(ns *netns.NsHandle) (chan netlink.AddrUpdate, chan struct{}, error) {
	ch, done := make(chan netlink.AddrUpdate, 64), make(chan struct{})
	opts := netlink.AddrSubscribeOptions{Namespace: ns, ListExisting: true,
		ErrorCallback: func(err error) { l.log.Warn("host address subscription", "err", err) }}
	if err := netlink.AddrSubscribeWithOptions(ch, done, opts); err != nil {
		close(done)
		return nil, nil, fmt.Errorf("watch host addresses: subscribe: %w", err)
	}
	return ch, done, nil
}

// watchAddrs delivers updates until ctx ends or the datapath closes,
// subscribing again when the kernel ends a subscription.
func (l *Linux) watchAddrs(ctx context.Context, ns *netns.NsHandle, ch chan netlink.AddrUpdate, done chan struct{}, fn func(HostAddrChange)) {
	defer func() {
		close(done)
		if ns != nil {
			ns.Close()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case u, ok := <-ch:
			if !ok {
				if l.isClosed() || ctx.Err() != nil {
					return
				}
				close(done)
				var err error
				if ch, done, err = l.subscribeAddrs(ns); err != nil {
					l.log.Error("host address subscription lost; host addresses added from now on are world until restart", "err", err)
					done = make(chan struct{})
					return
				}
				continue
			}
			ip, ok := netip.AddrFromSlice(u.LinkAddress.IP)
			if ok && ip.Unmap().IsGlobalUnicast() {
				fn(HostAddrChange{Addr: ip.Unmap(), Deleted: !u.NewAddr})
			}
		}
	}
}

// isClosed reports whether Close ran.
func (l *Linux) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}
