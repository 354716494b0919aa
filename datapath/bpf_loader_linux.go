package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/membrane-cni/membrane/bpf"
)

// template is the endpoint object parsed once (bpf.LoadEndpoint). Its
// endpoint programs are loaded once per node (nodePrograms) and shared by
// every endpoint: the programs find the endpoint of a packet in the
// endpoints map by the host veth's ifindex, and its policy maps in the
// policy_maps and cidr_maps outer maps by the slot its entry names
// (bpf_slots_linux.go).
type template struct {
	spec   *ebpf.CollectionSpec
	cache  *btf.Cache // kernel BTF decoded once for all loads
	digest string     // names the object (objectDigest)
}

// objectDigest names this build's endpoint object; the node's programs
// are pinned under it. A variable so that tests can pose as another
// build (a changed object after an upgrade).
var objectDigest = bpf.EndpointObjectDigest

// newTemplate parses the endpoint object and sizes its maps (sizes
// with defaults).
func newTemplate(sizes MapSizes) (*template, error) {
	spec, err := bpf.LoadEndpoint()
	if err != nil {
		return nil, fmt.Errorf("parse endpoint object: %w", err)
	}
	for _, outer := range []string{bpf.EndpointMapPolicyMaps, bpf.EndpointMapCidrMaps} {
		if ms := spec.Maps[outer]; ms == nil || ms.InnerMap == nil {
			return nil, fmt.Errorf("parse endpoint object: %s is not a map of maps", outer)
		}
		spec.Maps[outer].InnerMap.MaxEntries = uint32(sizes.PolicyMax)
	}
	spec.Maps[bpf.EndpointMapIpcache].MaxEntries = uint32(sizes.IPCacheMax)
	spec.Maps[bpf.EndpointMapCt].MaxEntries = uint32(sizes.CTMax)
	return &template{spec: spec, cache: btf.NewCache(), digest: objectDigest()}, nil
}

// policySpec and cidrSpec are the layouts of an endpoint's policy maps:
// the inner map templates of policy_maps and cidr_maps, so that the
// kernel accepts them as their values.
func (t *template) policySpec() *ebpf.MapSpec {
	return t.innerSpec(bpf.EndpointMapPolicyMaps, "policy")
}

func (t *template) cidrSpec() *ebpf.MapSpec {
	return t.innerSpec(bpf.EndpointMapCidrMaps, "cidr_policy")
}

func (t *template) innerSpec(outer, name string) *ebpf.MapSpec {
	s := t.spec.Maps[outer].InnerMap.Copy()
	s.Name, s.Pinning = name, ebpf.PinNone
	return s
}

// sharedMaps are the node-wide maps every endpoint program uses.
type sharedMaps struct {
	ipcache, ct, drops, events *ebpf.Map
	// endpoints: host veth ifindex -> endpoint (bpf.EndpointEndpointInfo);
	// policyMaps, cidrMaps: slot -> an endpoint's policy maps.
	endpoints, policyMaps, cidrMaps *ebpf.Map
	// config: the node's settings (bpf.EndpointNodeConfig at key 0; the
	// tunnel port, written by SyncNodes).
	config *ebpf.Map
	// hostSafe: the host firewall's safety-net peers (bpf/hostfw.h).
	hostSafe *ebpf.Map
	// flows: the flow reports' ring; flowConfig: whether the programs
	// report flows (key 0); flowStats: their per-CPU counters.
	flows, flowConfig, flowStats *ebpf.Map
	lb                           lbMaps // the service maps (bpf_lb_linux.go)
}

// core are the maps both endpoint programs use.
func (sm sharedMaps) core() []*ebpf.Map {
	return []*ebpf.Map{sm.ipcache, sm.ct, sm.drops, sm.events, sm.endpoints, sm.policyMaps, sm.cidrMaps}
}

// all are the shared maps: core, those only one program uses (config:
// from_container) and the service maps.
func (sm sharedMaps) all() []*ebpf.Map {
	return append(append(sm.core(), sm.config, sm.hostSafe, sm.flows, sm.flowConfig, sm.flowStats), sm.lb.all()...)
}

// openShared opens (or creates) the shared maps pinned under dir.
func (t *template) openShared(dir string) (sm sharedMaps, retErr error) {
	defer func() {
		if retErr != nil {
			sm.close()
		}
	}()
	for _, m := range append(sm.named(), sm.lb.named()...) {
		spec := t.spec.Maps[m.name].Copy()
		spec.Pinning = ebpf.PinNone
		pin := m.pin
		if pin == "" {
			pin = m.name
		}
		open := openSharedMap
		switch m.name {
		case bpf.EndpointMapEndpoints:
			open = openEndpointsMap // carries an old layout's entries over
		case bpf.EndpointMapLbFrontends:
			open = openFrontendsMap // the same
		}
		mp, err := open(spec, filepath.Join(dir, pin))
		if err != nil {
			return sm, err
		}
		*m.dst = mp
	}
	return sm, nil
}

// named are the endpoint maps (the service maps apart) by object name.
func (sm *sharedMaps) named() []namedMap {
	return []namedMap{
		{name: bpf.EndpointMapIpcache, dst: &sm.ipcache},
		{name: bpf.EndpointMapCt, dst: &sm.ct},
		{name: bpf.EndpointMapDrops, dst: &sm.drops},
		{name: bpf.EndpointMapEvents, dst: &sm.events},
		{name: bpf.EndpointMapEndpoints, pin: pinEndpointInfo, dst: &sm.endpoints},
		{name: bpf.EndpointMapPolicyMaps, pin: pinPolicyMaps, dst: &sm.policyMaps},
		{name: bpf.EndpointMapCidrMaps, pin: pinCIDRMaps, dst: &sm.cidrMaps},
		{name: bpf.EndpointMapNodeConfig, dst: &sm.config},
		{name: bpf.EndpointMapHostSafe, dst: &sm.hostSafe},
		{name: bpf.EndpointMapFlows, dst: &sm.flows},
		{name: bpf.EndpointMapFlowConfig, dst: &sm.flowConfig},
		{name: bpf.EndpointMapFlowStats, dst: &sm.flowStats},
	}
}

// namedMap is a shared map's name in the object, its pin name (the
// object name when empty) and where it is kept.
type namedMap struct {
	name string
	dst  **ebpf.Map
	pin  string
}

// replacements are the shared maps by name, for a program load.
func (sm sharedMaps) replacements() map[string]*ebpf.Map {
	r := map[string]*ebpf.Map{}
	for _, m := range append(sm.named(), sm.lb.named()...) {
		r[m.name] = *m.dst
	}
	return r
}

func (sm sharedMaps) close() {
	for _, m := range sm.all() {
		if m != nil {
			m.Close()
		}
	}
}

// programs are the node's endpoint programs.
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

// ids returns the programs' kernel IDs (from, to).
func (p programs) ids() ([2]ebpf.ProgramID, error) {
	var out [2]ebpf.ProgramID
	for i, pr := range []*ebpf.Program{p.from, p.to} {
		info, err := pr.Info()
		if err != nil {
			return out, fmt.Errorf("endpoint program info: %w", err)
		}
		id, ok := info.ID()
		if !ok {
			return out, errors.New("endpoint program info: no ID")
		}
		out[i] = id
	}
	return out, nil
}

// load loads the two endpoint programs with the shared maps. They go
// through the kernel's verifier at once, each on a goroutine of its own
// (most of a load is the verifier, and the programs are independent).
func (t *template) load(sm sharedMaps) (p programs, retErr error) {
	spec := t.spec.Copy()
	delete(spec.Programs, bpf.EndpointProgFromNetdev) // the uplinks' (bpf_kpr_linux.go)
	delete(spec.Programs, bpf.EndpointProgNodeportReply)
	delete(spec.Programs, bpf.EndpointProgToNetdev)
	opts := &ebpf.CollectionOptions{MapReplacements: sm.replacements(), Cache: t.cache}
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
		return programs{}, fmt.Errorf("load endpoint programs: %w", err)
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

// Pin names of the node's endpoint programs under
// <bpffs>/programs/<object digest>/.
const (
	pinProgFrom = "from_container"
	pinProgTo   = "to_container"
)

// nodePrograms returns the node's endpoint programs: the ones pinned for
// this object when they use exactly the shared maps open now (a
// restarted agent of the same build keeps them, and its endpoints keep
// running them), else a new load, pinned in place of those of any other
// object (an upgrade: the endpoints' attachments are replaced as each is
// realised again).
func (b *bpfState) nodePrograms() (programs, error) {
	root := filepath.Join(b.dir, pinProgramsDir)
	dir := filepath.Join(root, b.tmpl.digest)
	if p, ok := b.pinnedPrograms(dir); ok {
		return p, nil
	}
	p, err := b.tmpl.load(b.maps)
	if err != nil {
		return programs{}, err
	}
	if err := pinPrograms(root, dir, p); err != nil {
		p.close()
		return programs{}, err
	}
	return p, nil
}

// pinnedPrograms opens the programs pinned in dir if both use the core
// shared maps and no map that is not a shared one.
func (b *bpfState) pinnedPrograms(dir string) (programs, bool) {
	var p programs
	var err error
	if p.from, err = ebpf.LoadPinnedProgram(filepath.Join(dir, pinProgFrom), nil); err != nil {
		return programs{}, false
	}
	if p.to, err = ebpf.LoadPinnedProgram(filepath.Join(dir, pinProgTo), nil); err != nil {
		p.close()
		return programs{}, false
	}
	core, err := mapIDs(b.maps.core()...)
	if err != nil {
		p.close()
		return programs{}, false
	}
	all, err := mapIDs(b.maps.all()...)
	if err != nil {
		p.close()
		return programs{}, false
	}
	for _, pr := range []*ebpf.Program{p.from, p.to} {
		if !usesMaps(pr, core, all) {
			p.close()
			return programs{}, false
		}
	}
	return p, true
}

// usesMaps reports whether prog uses every map of core and none outside
// all.
func usesMaps(prog *ebpf.Program, core, all []ebpf.MapID) bool {
	info, err := prog.Info()
	if err != nil {
		return false
	}
	ids, ok := info.MapIDs()
	if !ok {
		return false
	}
	for _, id := range ids {
		if !slices.Contains(all, id) {
			return false
		}
	}
	for _, id := range core {
		if !slices.Contains(ids, id) {
			return false
		}
	}
	return true
}

// pinPrograms pins p in dir and removes the other objects' directories
// under root (the programs they pinned stay loaded while an interface
// runs them).
func pinPrograms(root, dir string, p programs) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("pin endpoint programs: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("pin endpoint programs: %w", err)
	}
	for name, pr := range map[string]*ebpf.Program{pinProgFrom: p.from, pinProgTo: p.to} {
		if err := pr.Pin(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("pin endpoint program %s: %w", name, err)
		}
	}
	ents, err := os.ReadDir(root)
	if err != nil {
		return fmt.Errorf("pin endpoint programs: %w", err)
	}
	for _, e := range ents {
		if other := filepath.Join(root, e.Name()); other != dir {
			if err := os.RemoveAll(other); err != nil {
				return fmt.Errorf("unpin old endpoint programs: %w", err)
			}
		}
	}
	return nil
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
