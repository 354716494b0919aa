package datapath

import (
	"errors"
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

// rodata is the object's constants section: ENDPOINT_ID and
// ENDPOINT_IDENTITY, frozen before the programs are verified.
const rodata = ".rodata"

// load loads the endpoint programs for id with its identity, using the
// shared maps and the endpoint's policy maps. The constants map is made
// first; then the two programs go through the kernel's verifier at once,
// each on a goroutine of its own (most of a load is the verifier, and
// the programs are independent), sharing it.
func (t *template) load(sm sharedMaps, pol, cidr *ebpf.Map, id endpoint.ID, ident identity.NumericIdentity) (p programs, retErr error) {
	spec := t.spec.Copy()
	if err := spec.Variables[bpf.EndpointVarENDPOINT_ID].Set(uint32(id)); err != nil {
		return programs{}, fmt.Errorf("load endpoint %d programs: set id: %w", id, err)
	}
	if err := spec.Variables[bpf.EndpointVarENDPOINT_IDENTITY].Set(uint32(ident)); err != nil {
		return programs{}, fmt.Errorf("load endpoint %d programs: set identity: %w", id, err)
	}
	repl := sm.replacements()
	repl[bpf.EndpointMapPolicy] = pol
	repl[bpf.EndpointMapCidrPolicy] = cidr
	var consts struct {
		Map *ebpf.Map `ebpf:".rodata"`
	}
	if err := spec.LoadAndAssign(&consts, &ebpf.CollectionOptions{Cache: t.cache}); err != nil {
		return programs{}, fmt.Errorf("load endpoint %d programs: constants: %w", id, err)
	}
	defer consts.Map.Close() // the programs hold it
	repl[rodata] = consts.Map
	opts := &ebpf.CollectionOptions{MapReplacements: repl, Cache: t.cache}
	other := spec.Copy()
	var toErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.to, toErr = loadOne(other, bpf.EndpointProgToContainer, opts)
	}()
	var fromErr error
	p.from, fromErr = loadOne(spec, bpf.EndpointProgFromContainer, opts)
	<-done
	if err := errors.Join(fromErr, toErr); err != nil {
		p.close()
		return programs{}, fmt.Errorf("load endpoint %d programs: %w", id, err)
	}
	return p, nil
}

// loadOne loads the program called name from spec (and, with it, only
// the maps it uses; opts replaces them all).
func loadOne(spec *ebpf.CollectionSpec, name string, opts *ebpf.CollectionOptions) (*ebpf.Program, error) {
	var prog *ebpf.Program
	var err error
	switch name {
	case bpf.EndpointProgFromContainer:
		var obj struct {
			Prog *ebpf.Program `ebpf:"from_container"`
		}
		err, prog = spec.LoadAndAssign(&obj, opts), obj.Prog
	case bpf.EndpointProgToContainer:
		var obj struct {
			Prog *ebpf.Program `ebpf:"to_container"`
		}
		err, prog = spec.LoadAndAssign(&obj, opts), obj.Prog
	default:
		err = errors.New("not an endpoint program")
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return prog, nil
}
