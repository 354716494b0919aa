package datapath

import (
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// template is the endpoint object parsed once (bpf.LoadEndpoint); every
// endpoint loads a copy with its own constants and the shared maps.
type template struct {
	spec  *ebpf.CollectionSpec
	cache *btf.Cache // kernel BTF decoded once for all loads
	tags  tags       // the programs' kernel tags (progTags)
}

func newTemplate() (*template, error) {
	spec, err := bpf.LoadEndpoint()
	if err != nil {
		return nil, fmt.Errorf("parse endpoint object: %w", err)
	}
	return &template{spec: spec, cache: btf.NewCache()}, nil
}

// sharedMaps are the node-wide maps every endpoint program uses.
type sharedMaps struct {
	ipcache, ct, drops, events *ebpf.Map
	lb                         lbMaps // the service maps (bpf_lb_linux.go)
}

// openShared opens (or creates) the shared maps pinned under dir.
func (t *template) openShared(dir string) (sm sharedMaps, retErr error) {
	defer func() {
		if retErr != nil {
			sm.close()
		}
	}()
	for _, m := range append([]namedMap{
		{bpf.EndpointMapIpcache, &sm.ipcache},
		{bpf.EndpointMapCt, &sm.ct},
		{bpf.EndpointMapDrops, &sm.drops},
		{bpf.EndpointMapEvents, &sm.events},
	}, sm.lb.named()...) {
		spec := t.spec.Maps[m.name].Copy()
		spec.Pinning = ebpf.PinNone
		mp, err := openSharedMap(spec, filepath.Join(dir, m.name))
		if err != nil {
			return sm, err
		}
		*m.dst = mp
	}
	return sm, nil
}

// namedMap is a shared map's name in the object and where it is kept.
type namedMap struct {
	name string
	dst  **ebpf.Map
}

// replacements are the shared maps by name, for a program load.
func (sm sharedMaps) replacements() map[string]*ebpf.Map {
	r := map[string]*ebpf.Map{
		bpf.EndpointMapIpcache: sm.ipcache,
		bpf.EndpointMapCt:      sm.ct,
		bpf.EndpointMapDrops:   sm.drops,
		bpf.EndpointMapEvents:  sm.events,
	}
	for _, m := range sm.lb.named() {
		r[m.name] = *m.dst
	}
	return r
}

func (sm sharedMaps) close() {
	for _, m := range append([]*ebpf.Map{sm.ipcache, sm.ct, sm.drops, sm.events}, sm.lb.all()...) {
		if m != nil {
			m.Close()
		}
	}
}

// programs are one endpoint's loaded programs.
type programs struct {
	from, to *ebpf.Program
}

func (p programs) close() {
	for _, pr := range []*ebpf.Program{p.from, p.to} {
		if pr != nil {
			pr.Close()
		}
	}
}

// load loads the endpoint programs for id with its identity, using the
// shared maps and the endpoint's policy maps.
func (t *template) load(sm sharedMaps, pol, cidr *ebpf.Map, id endpoint.ID, ident identity.NumericIdentity) (programs, error) {
	spec := t.spec.Copy()
	delete(spec.Programs, bpf.EndpointProgFromNetdev) // the uplinks' (bpf_kpr_linux.go)
	delete(spec.Programs, bpf.EndpointProgNodeportReply)
	if err := spec.Variables[bpf.EndpointVarENDPOINT_ID].Set(uint32(id)); err != nil {
		return programs{}, fmt.Errorf("load endpoint %d programs: set id: %w", id, err)
	}
	if err := spec.Variables[bpf.EndpointVarENDPOINT_IDENTITY].Set(uint32(ident)); err != nil {
		return programs{}, fmt.Errorf("load endpoint %d programs: set identity: %w", id, err)
	}
	repl := sm.replacements()
	repl[bpf.EndpointMapPolicy] = pol
	repl[bpf.EndpointMapCidrPolicy] = cidr
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: repl, Cache: t.cache})
	if err != nil {
		return programs{}, fmt.Errorf("load endpoint %d programs: %w", id, err)
	}
	defer coll.Close()
	return programs{
		from: coll.DetachProgram(bpf.EndpointProgFromContainer),
		to:   coll.DetachProgram(bpf.EndpointProgToContainer),
	}, nil
}
