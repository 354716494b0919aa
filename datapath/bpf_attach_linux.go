package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// hook is one attach point of an endpoint program on its host veth.
type hook struct {
	// pin is the TCX link's pin name under the endpoint's directory.
	pin string
	// tcx is the TCX attach type.
	tcx ebpf.AttachType
	// parent is the clsact parent of the legacy cls_bpf filter.
	parent uint32
	// name is the legacy filter's name.
	name string
}

// from-container runs where the host veth receives (the pod's egress),
// to-container where it transmits (the pod's ingress).
var (
	hookFrom = hook{pin: pinLinkFrom, tcx: ebpf.AttachTCXIngress, parent: netlink.HANDLE_MIN_INGRESS, name: "membrane-from"}
	hookTo   = hook{pin: pinLinkTo, tcx: ebpf.AttachTCXEgress, parent: netlink.HANDLE_MIN_EGRESS, name: "membrane-to"}
)

// legacyPriority and legacyHandle identify Membrane's cls_bpf filters.
const (
	legacyPriority = 1
	legacyHandle   = 1
)

// attachTCX makes the TCX link pinned at dir/h.pin run prog on ifindex:
// the pinned link (from a previous realise or a previous agent) is
// updated in place, so traffic never runs without a program; a missing
// link, or one on another interface, is replaced by a new pinned link.
// inHost runs the attach in the host netns (ifindex is resolved there).
// Returns ebpf.ErrNotSupported if the kernel has no TCX.
func attachTCX(dir string, h hook, ifindex int, prog *ebpf.Program, inHost func(func() error) error) (link.Link, error) {
	path := filepath.Join(dir, h.pin)
	if l, err := link.LoadPinnedLink(path, nil); err == nil {
		if onInterface(l, ifindex) && l.Update(prog) == nil {
			return l, nil
		}
		// Stale (interface gone or replaced): detach it.
		_ = l.Unpin()
		l.Close()
	} else if !errors.Is(err, os.ErrNotExist) {
		// Something else is pinned there: replace it.
		if err := unpin(path); err != nil {
			return nil, err
		}
	}
	var l link.Link
	err := inHost(func() error {
		var err error
		l, err = link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: h.tcx})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("attach tcx %s ifindex %d: %w", h.name, ifindex, err)
	}
	if err := l.Pin(path); err != nil {
		l.Close()
		return nil, fmt.Errorf("pin tcx link %s: %w", path, err)
	}
	return l, nil
}

// onInterface reports whether the TCX link l is attached to ifindex.
func onInterface(l link.Link, ifindex int) bool {
	info, err := l.Info()
	if err != nil || info.TCX() == nil {
		return false
	}
	return int(info.TCX().Ifindex) == ifindex
}

// detachTCX unpins the endpoint's TCX link of h (if any) and returns it
// still open: closing it detaches the program, which waits for an RCU
// grace period, so callers close it off the caller's path.
func detachTCX(dir string, h hook) (link.Link, error) {
	path := filepath.Join(dir, h.pin)
	l, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, unpin(path)
	}
	if err := l.Unpin(); err != nil {
		l.Close()
		return nil, fmt.Errorf("unpin tcx link %s: %w", path, err)
	}
	return l, nil
}

// attachLegacy makes the clsact cls_bpf filter of h on ifindex run prog
// (the fallback where TCX is missing). Replacing the filter is atomic;
// the filter holds the program, so it survives the agent.
func attachLegacy(nl *netlink.Handle, h hook, ifindex int, prog *ebpf.Program) error {
	qdisc := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := nl.QdiscAdd(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("attach cls_bpf %s: add clsact to ifindex %d: %w", h.name, ifindex, err)
	}
	filter := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: ifindex, Parent: h.parent, Handle: legacyHandle,
			Priority: legacyPriority, Protocol: unix.ETH_P_ALL,
		},
		Fd: prog.FD(), Name: h.name, DirectAction: true,
	}
	if err := nl.FilterReplace(filter); err != nil {
		return fmt.Errorf("attach cls_bpf %s ifindex %d: %w", h.name, ifindex, err)
	}
	return nil
}

// detachLegacy deletes the cls_bpf filter of h; a missing filter or
// interface is success.
func detachLegacy(nl *netlink.Handle, h hook, ifindex int) error {
	filter := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{
		LinkIndex: ifindex, Parent: h.parent, Handle: legacyHandle,
		Priority: legacyPriority, Protocol: unix.ETH_P_ALL,
	}}
	err := nl.FilterDel(filter)
	if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENODEV) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("detach cls_bpf %s ifindex %d: %w", h.name, ifindex, err)
	}
	return nil
}

// attachDevice makes a shared device (uplink, tunnel device) run prog at
// h: a TCX link pinned in dir (updated in place), which nothing else on
// the node can detach or displace, or a cls_bpf filter when forced or
// where the kernel lacks TCX.
func (l *Linux) attachDevice(b *bpfState, dir string, h hook, ifindex int, prog *ebpf.Program) error {
	b.mu.Lock()
	legacy := b.devLegacy
	b.mu.Unlock()
	if !legacy {
		lk, err := attachTCX(dir, h, ifindex, prog, l.inHost)
		if err == nil {
			b.holdLink(filepath.Join(dir, h.pin), lk)
			return nil
		}
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return err
		}
		l.log.Warn("kernel has no TCX: attaching device programs with clsact + cls_bpf", "err", err)
		b.mu.Lock()
		b.devLegacy = true
		b.mu.Unlock()
	}
	return attachLegacy(l.nl, h, ifindex, prog)
}
