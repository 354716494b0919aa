package datapath

import (
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// The shared devices' and the cgroup's links (the uplinks' from_netdev
// and to_netdev, the tunnel device's overlay programs, the kube-proxy-free
// mode's socket programs) are held open besides their pins, as each
// endpoint's links are: a pin removed under the agent (rm -rf of the
// bpffs directory, a fresh bpffs mounted over it) would otherwise release
// a link's last reference and detach its program: the host firewall,
// the overlay's identity checks and the Services' socket translation
// would stop at once, failing open. Closing a held link detaches nothing
// while it is pinned; the agent's own detaches (prunePins, removeTunnel)
// unpin and then release it. The pin check pins them again (checkPins),
// with the overlay's maps registered in mapPins.

// holdLink keeps lk, pinned at path, open; a different link held for
// path (replaced: unpinned by the caller) is closed, which detaches it.
func (b *bpfState) holdLink(path string, lk link.Link) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held == nil {
		b.held = map[string]link.Link{}
	}
	if old := b.held[path]; old != nil && old != lk {
		old.Close()
	}
	b.held[path] = lk
}

// releaseLink closes the link held for path (unpinned by the caller:
// closing the last reference detaches its program).
func (b *bpfState) releaseLink(path string) {
	b.mu.Lock()
	lk := b.held[path]
	delete(b.held, path)
	b.mu.Unlock()
	if lk != nil {
		lk.Close()
	}
}

// releaseLinksUnder releases every link held under dir.
func (b *bpfState) releaseLinksUnder(dir string) {
	b.mu.Lock()
	var paths []string
	for p := range b.held {
		if strings.HasPrefix(p, dir+string(filepath.Separator)) {
			paths = append(paths, p)
		}
	}
	b.mu.Unlock()
	for _, p := range paths {
		b.releaseLink(p)
	}
}

// pinnedMap registers m, pinned at path and owned by the caller, with
// the pin check.
func (b *bpfState) pinnedMap(path string, m *ebpf.Map) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mapPins == nil {
		b.mapPins = map[string]*ebpf.Map{}
	}
	b.mapPins[path] = m
}

// closeHeld closes the held links (their pins keep them attached) at
// the agent's stop. b.mu held.
func (b *bpfState) closeHeldLocked() {
	for _, lk := range b.held {
		lk.Close()
	}
	b.held, b.mapPins = nil, nil
}
