package datapath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// tags are the kernel tags (hash of the instructions after loading, map
// references left out) of the template's two programs, learnt by one
// probe load: a program with the same tag runs this build's code.
type tags struct {
	once     sync.Once
	from, to string
	err      error
}

// progTags loads the template once (without attaching it) to learn its
// programs' tags.
func (t *template) progTags(sm sharedMaps) (from, to string, err error) {
	t.tags.once.Do(func() {
		spec := t.spec.Copy()
		delete(spec.Programs, bpf.EndpointProgFromNetdev) // not an endpoint's (bpf_kpr_linux.go)
		delete(spec.Programs, bpf.EndpointProgNodeportReply)
		coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: sm.replacements(), Cache: t.cache})
		if err != nil {
			t.tags.err = fmt.Errorf("probe load: %w", err)
			return
		}
		defer coll.Close()
		for name, dst := range map[string]*string{bpf.EndpointProgFromContainer: &t.tags.from, bpf.EndpointProgToContainer: &t.tags.to} {
			info, err := coll.Programs[name].Info()
			if err != nil {
				t.tags.err = fmt.Errorf("probe load: %w", err)
				return
			}
			*dst = info.Tag
		}
	})
	return t.tags.from, t.tags.to, t.tags.err
}

// adopt reports whether the programs a previous agent attached for
// endpoint id through the TCX links pinned in dir run this build's code
// with id and ident on ifindex and use exactly the maps open now (the
// shared ones, pm and cm): then they are kept and an agent restart reloads
// nothing.
func (b *bpfState) adopt(dir string, id endpoint.ID, ident identity.NumericIdentity, ifindex int, pm, cm *ebpf.Map) bool {
	fromTag, toTag, err := b.tmpl.progTags(b.maps)
	if err != nil {
		return false
	}
	for i, tag := range [2]string{fromTag, toTag} {
		lk, err := link.LoadPinnedLink(filepath.Join(dir, hooks[i].pin), nil)
		if err != nil {
			return false
		}
		prog := b.adoptable(lk, tag, id, ident, ifindex, pm, cm)
		lk.Close()
		if prog == nil {
			return false
		}
		prog.Close()
	}
	return true
}

// adoptable returns the program of lk if it qualifies for adopt.
func (b *bpfState) adoptable(lk link.Link, tag string, id endpoint.ID, ident identity.NumericIdentity, ifindex int, pm, cm *ebpf.Map) *ebpf.Program {
	info, err := lk.Info()
	if err != nil || info.TCX() == nil || int(info.TCX().Ifindex) != ifindex {
		return nil
	}
	prog, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		return nil
	}
	if !b.runs(prog, tag, id, ident, pm, cm) {
		prog.Close()
		return nil
	}
	return prog
}

// runs reports whether prog has tag, uses the open maps and was loaded
// with id and ident.
func (b *bpfState) runs(prog *ebpf.Program, tag string, id endpoint.ID, ident identity.NumericIdentity, pm, cm *ebpf.Map) bool {
	pi, err := prog.Info()
	if err != nil || pi.Tag != tag {
		return false
	}
	ids, ok := pi.MapIDs()
	if !ok {
		return false
	}
	// Every program uses the core maps; the service maps only where its
	// code does (to-container: lb_revnat). Anything else is its .rodata.
	core, err := mapIDs(b.maps.ipcache, b.maps.ct, b.maps.drops, b.maps.events, pm, cm)
	if err != nil {
		return false
	}
	lb, err := mapIDs(b.maps.lb.all()...)
	if err != nil {
		return false
	}
	var rodata []ebpf.MapID
	for _, mid := range ids {
		if !slices.Contains(core, mid) && !slices.Contains(lb, mid) {
			rodata = append(rodata, mid)
		}
	}
	for _, mid := range core {
		if !slices.Contains(ids, mid) {
			return false
		}
	}
	if len(rodata) != 1 {
		return false
	}
	gotID, gotIdent, err := b.constants(rodata[0])
	return err == nil && gotID == uint32(id) && gotIdent == uint32(ident)
}

// constants reads ENDPOINT_ID and ENDPOINT_IDENTITY from a loaded
// program's .rodata map.
func (b *bpfState) constants(mid ebpf.MapID) (id, ident uint32, err error) {
	m, err := ebpf.NewMapFromID(mid)
	if err != nil {
		return 0, 0, err
	}
	defer m.Close()
	val := make([]byte, m.ValueSize())
	if err := m.Lookup(uint32(0), val); err != nil {
		return 0, 0, err
	}
	read := func(name string) (uint32, error) {
		v := b.tmpl.spec.Variables[name]
		var x uint32
		if int(v.Offset)+4 > len(val) {
			return 0, fmt.Errorf("variable %s outside .rodata", name)
		}
		err := binary.Read(bytes.NewReader(val[v.Offset:v.Offset+4]), binary.NativeEndian, &x)
		return x, err
	}
	if id, err = read(bpf.EndpointVarENDPOINT_ID); err != nil {
		return 0, 0, err
	}
	ident, err = read(bpf.EndpointVarENDPOINT_IDENTITY)
	return id, ident, err
}

// mapIDs returns the kernel IDs of ms.
func mapIDs(ms ...*ebpf.Map) ([]ebpf.MapID, error) {
	out := make([]ebpf.MapID, 0, len(ms))
	for _, m := range ms {
		mi, err := m.Info()
		if err != nil {
			return nil, err
		}
		mid, _ := mi.ID()
		out = append(out, mid)
	}
	return out, nil
}
