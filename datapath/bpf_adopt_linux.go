package datapath

import (
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// adopt looks at what a previous agent attached for endpoint id on
// ifindex: TCX links pinned in dir, or Membrane's cls_bpf filters. The
// endpoint keeps that mode. When both hooks run the node's current
// programs (same program IDs: the pinned programs of this object,
// bpf_loader_linux.go) and the endpoints map names id and its slot for
// ifindex, the attachment is adopted and an agent restart attaches nothing
// (Realize rewrites the entry if its identity or addresses are not the
// endpoint's); otherwise Realize replaces it in place (TCX link update, cls_bpf
// filter replace), so that traffic never runs without a program.
func (l *Linux) adopt(e *bpfEndpoint, id endpoint.ID, dir string, ifindex int) {
	ids, tcx, found := l.attachedIDs(dir, ifindex)
	if !found {
		return
	}
	e.legacy = !tcx
	var v bpf.EndpointEndpointInfo
	if err := l.bpf.maps.endpoints.Lookup(uint32(ifindex), &v); err != nil || v.Id != uint32(id) || v.Slot != e.slot {
		return
	}
	if ids == l.bpf.progID {
		e.attached, e.identity, e.addrs, e.ifindex = true, identity.NumericIdentity(v.Identity), infoAddrs(v), ifindex
		e.audit, e.enf = v.Flags&endpointFlagAudit != 0, v.Flags&endpointFlagsEnforce
	}
}

// attachedIDs returns the IDs of the programs attached for an endpoint
// at its two hooks on ifindex (zero where none is), whether they are
// TCX links, and whether anything was found.
func (l *Linux) attachedIDs(dir string, ifindex int) (ids [2]ebpf.ProgramID, tcx, found bool) {
	for i, h := range hooks {
		if id, ok := tcxProgram(filepath.Join(dir, h.pin), ifindex); ok {
			ids[i], tcx, found = id, true, true
		}
	}
	if found {
		return ids, true, true
	}
	lk, err := l.nl.LinkByIndex(ifindex)
	if err != nil {
		return ids, false, false
	}
	for i, h := range hooks {
		if id, ok := legacyProgram(l.nl, lk, h); ok {
			ids[i], found = id, true
		}
	}
	return ids, false, found
}

// tcxProgram returns the program of the TCX link pinned at path if it is
// attached to ifindex.
func tcxProgram(path string, ifindex int) (ebpf.ProgramID, bool) {
	lk, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		return 0, false
	}
	defer lk.Close()
	info, err := lk.Info()
	if err != nil || info.TCX() == nil || int(info.TCX().Ifindex) != ifindex {
		return 0, false
	}
	return info.Program, true
}

// legacyProgram returns the program of Membrane's cls_bpf filter of h on
// lk.
func legacyProgram(nl *netlink.Handle, lk netlink.Link, h hook) (ebpf.ProgramID, bool) {
	filters, err := nl.FilterList(lk, h.parent)
	if err != nil {
		return 0, false
	}
	for _, f := range filters {
		bf, ok := f.(*netlink.BpfFilter)
		if ok && bf.Priority == legacyPriority && bf.Handle == legacyHandle && bf.Name == h.name {
			return ebpf.ProgramID(bf.Id), true
		}
	}
	return 0, false
}
