package identity

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// newAllocator returns a LocalAllocator for cfg or fails the test.
func newAllocator(tb testing.TB, cfg LocalConfig) *LocalAllocator {
	tb.Helper()
	a, err := NewLocalAllocator(cfg)
	if err != nil {
		tb.Fatalf("NewLocalAllocator(%+v): %v", cfg, err)
	}
	return a
}

func TestLocalConfigValidate(t *testing.T) {
	tests := []struct {
		name      string
		cfg       LocalConfig
		wantField string // "" for a valid config
	}{
		{"zero value", LocalConfig{}, ""},
		{"tiny range", LocalConfig{MinID: 300, MaxID: 300}, ""},
		{"only max", LocalConfig{MaxID: 1000}, ""},
		{"full uint32", LocalConfig{MinID: 256, MaxID: ^NumericIdentity(0)}, ""},
		{"min in reserved range", LocalConfig{MinID: 5, MaxID: 1000}, "MinID"},
		{"max below min", LocalConfig{MinID: 1000, MaxID: 999}, "MaxID"},
		{"max below default min", LocalConfig{MaxID: 100}, "MaxID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantField == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.wantField) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig naming %s", err, tt.wantField)
			}
			if _, err := NewLocalAllocator(tt.cfg); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("NewLocalAllocator() = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

// step is one call in an allocator scenario.
type step struct {
	op     string   // "alloc", "release" or "restore"
	labels []string // alloc, restore
	id     NumericIdentity
	refs   int // restore: RefCount to restore

	wantID   NumericIdentity // alloc
	wantFlag bool            // alloc: isNew; release: released
	wantRefs int             // alloc
	wantErr  error
}

func alloc(wantID NumericIdentity, isNew bool, refs int, ls ...string) step {
	return step{op: "alloc", labels: ls, wantID: wantID, wantFlag: isNew, wantRefs: refs}
}

func allocErr(err error, ls ...string) step {
	return step{op: "alloc", labels: ls, wantErr: err}
}

func release(id NumericIdentity, released bool, err error) step {
	return step{op: "release", id: id, wantFlag: released, wantErr: err}
}

func restore(id NumericIdentity, refs int, err error, ls ...string) step {
	return step{op: "restore", id: id, refs: refs, labels: ls, wantErr: err}
}

// run performs s on a and fails the test if the result differs.
func (s step) run(tb testing.TB, a *LocalAllocator) {
	tb.Helper()
	var ls labels.Labels
	if s.labels != nil {
		ls = mustLabels(tb, s.labels...)
	}
	switch s.op {
	case "alloc":
		got, isNew, err := a.Allocate(ls)
		if !errors.Is(err, s.wantErr) || got.ID != s.wantID || isNew != s.wantFlag || got.RefCount != s.wantRefs {
			tb.Fatalf("Allocate(%s) = %d (refs %d), %v, %v; want %d (refs %d), %v, %v",
				ls, got.ID, got.RefCount, isNew, err, s.wantID, s.wantRefs, s.wantFlag, s.wantErr)
		}
		if err == nil && !got.Labels.Equal(ls) {
			tb.Fatalf("Allocate(%s) returned labels %s", ls, got.Labels)
		}
	case "release":
		released, err := a.Release(s.id)
		if !errors.Is(err, s.wantErr) || released != s.wantFlag {
			tb.Fatalf("Release(%d) = %v, %v; want %v, %v", s.id, released, err, s.wantFlag, s.wantErr)
		}
	case "restore":
		err := a.Restore(Identity{ID: s.id, Labels: ls, RefCount: s.refs})
		if !errors.Is(err, s.wantErr) {
			tb.Fatalf("Restore(%d, %s, %d) = %v, want %v", s.id, ls, s.refs, err, s.wantErr)
		}
	default:
		tb.Fatalf("unknown op %q", s.op)
	}
}

// scenario is a named sequence of steps on a fresh allocator.
type scenario struct {
	name  string
	cfg   LocalConfig
	steps []step
}

// runScenarios runs every scenario as a subtest.
func runScenarios(t *testing.T, scenarios []scenario) {
	t.Helper()
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			a := newAllocator(t, sc.cfg)
			for i, s := range sc.steps {
				t.Logf("step %d: %s %d %q", i, s.op, s.id, s.labels)
				s.run(t, a)
			}
		})
	}
}

func TestLocalAllocator(t *testing.T) {
	runScenarios(t, []scenario{
		{"first identity is 256", LocalConfig{}, []step{
			alloc(256, true, 1, "k8s:app=web"),
			alloc(257, true, 1, "k8s:app=db"),
		}},
		{"same labels same identity", LocalConfig{}, []step{
			alloc(256, true, 1, "k8s:app=web", "k8s:zone=a"),
			alloc(256, false, 2, "k8s:zone=a", "k8s:app=web"),
		}},
		{"release to zero frees", LocalConfig{}, []step{
			alloc(256, true, 1, "k8s:app=web"),
			alloc(256, false, 2, "k8s:app=web"),
			release(256, false, nil),
			release(256, true, nil),
			release(256, false, ErrNotFound),
			// The cursor moved on: the freed number is not re-bound yet.
			alloc(257, true, 1, "k8s:app=web"),
		}},
		{"reserved labels", LocalConfig{}, []step{
			alloc(ReservedHealth, false, 0, "reserved:health"),
			alloc(ReservedHost, false, 0, "reserved:host"),
			alloc(ReservedHost, false, 0, "reserved:host"),
			release(ReservedHost, false, nil),
			release(200, false, nil),
			alloc(256, true, 1, "reserved:host", "k8s:app=web"),
		}},
		{"invalid labels", LocalConfig{}, []step{
			allocErr(ErrInvalidLabels),
			allocErr(ErrInvalidLabels, []string{}...),
		}},
		{"unknown release", LocalConfig{}, []step{
			release(IdentityUnknown, false, ErrNotFound),
			release(300, false, ErrNotFound),
			alloc(256, true, 1, "k8s:a"),
			release(256, true, nil),
			release(256, false, ErrNotFound),
		}},
	})
}

func TestLocalAllocatorCursor(t *testing.T) {
	tiny := LocalConfig{MinID: 256, MaxID: 259}
	runScenarios(t, []scenario{
		{"reuse after wrap in ID order", tiny, []step{
			alloc(256, true, 1, "k8s:a"),
			alloc(257, true, 1, "k8s:b"),
			alloc(258, true, 1, "k8s:c"),
			release(257, true, nil),
			release(256, true, nil),
			alloc(259, true, 1, "k8s:d"),
			alloc(256, true, 1, "k8s:e"),
			alloc(257, true, 1, "k8s:f"),
			allocErr(ErrExhausted, "k8s:g"),
			alloc(258, false, 2, "k8s:c"),
			release(258, false, nil),
			release(258, true, nil),
			alloc(258, true, 1, "k8s:g"),
		}},
		{"exhaustion", LocalConfig{MinID: 1000, MaxID: 1001}, []step{
			alloc(1000, true, 1, "k8s:a"),
			alloc(1001, true, 1, "k8s:b"),
			allocErr(ErrExhausted, "k8s:c"),
			allocErr(ErrExhausted, "k8s:c"),
			alloc(1000, false, 2, "k8s:a"),
			alloc(ReservedWorld, false, 0, "reserved:world"),
			release(1001, true, nil),
			alloc(1001, true, 1, "k8s:c"),
		}},
		{"restore skipped by cursor", tiny, []step{
			restore(257, 3, nil, "k8s:b"),
			alloc(256, true, 1, "k8s:a"),
			alloc(258, true, 1, "k8s:c"),
			alloc(257, false, 4, "k8s:b"),
			restore(9000, 1, nil, "k8s:out-of-range"),
			alloc(259, true, 1, "k8s:d"),
			allocErr(ErrExhausted, "k8s:e"),
			release(9000, true, nil),
			allocErr(ErrExhausted, "k8s:e"),
		}},
	})
}

func TestAllocateMalformedLabels(t *testing.T) {
	a := newAllocator(t, LocalConfig{})
	unsorted := labels.Labels{{Source: "k8s", Key: "b"}, {Source: "k8s", Key: "a"}}
	if _, _, err := a.Allocate(unsorted); !errors.Is(err, ErrInvalidLabels) || !errors.Is(err, labels.ErrInvalidLabel) {
		t.Fatalf("Allocate(unsorted) error %v, want ErrInvalidLabels wrapping labels.ErrInvalidLabel", err)
	}
}

func TestRestore(t *testing.T) {
	setup := []step{
		alloc(256, true, 1, "k8s:app=web"),
		alloc(257, true, 1, "k8s:app=db"),
	}
	tests := []struct {
		name string
		s    step
		// wantRefs is the RefCount of s.id afterwards, -1 if not bound.
		wantRefs int
	}{
		{"new identity", restore(300, 2, nil, "k8s:app=cache"), 2},
		{"same binding sets refcount", restore(256, 5, nil, "k8s:app=web"), 5},
		{"id bound to other labels", restore(256, 1, ErrConflict, "k8s:app=cache"), 1},
		{"labels bound to other id", restore(300, 1, ErrConflict, "k8s:app=web"), -1},
		{"reserved identity, own labels", restore(ReservedHost, 1, nil, "reserved:host"), 0},
		{"reserved identity, other labels", restore(ReservedHost, 1, ErrConflict, "reserved:world"), 0},
		{"unused reserved number", restore(42, 1, ErrConflict, "k8s:app=cache"), -1},
		{"reserved labels, local id", restore(300, 1, ErrConflict, "reserved:health"), -1},
		{"identity zero", restore(IdentityUnknown, 1, ErrInvalidIdentity, "k8s:app=cache"), -1},
		{"zero refcount", restore(300, 0, ErrInvalidIdentity, "k8s:app=cache"), -1},
		{"empty labels", restore(300, 1, ErrInvalidLabels), -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAllocator(t, LocalConfig{})
			for _, s := range setup {
				s.run(t, a)
			}
			tt.s.run(t, a)
			got, ok := a.Lookup(tt.s.id)
			switch {
			case tt.wantRefs < 0 && ok:
				t.Fatalf("Lookup(%d) = %+v, want not bound", tt.s.id, got)
			case tt.wantRefs >= 0 && (!ok || got.RefCount != tt.wantRefs):
				t.Fatalf("Lookup(%d) = %+v, %v; want RefCount %d", tt.s.id, got, ok, tt.wantRefs)
			}
		})
	}
}

func TestLookup(t *testing.T) {
	a := newAllocator(t, LocalConfig{})
	web := mustLabels(t, "k8s:app=web")
	if _, _, err := a.Allocate(web); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		id     NumericIdentity
		ls     labels.Labels
		wantOK bool
	}{
		{"allocated", 256, web, true},
		{"reserved", ReservedInit, mustLabels(t, "reserved:init"), true},
		{"unknown", 257, mustLabels(t, "k8s:app=db"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			byID, ok := a.Lookup(tt.id)
			if ok != tt.wantOK || (ok && !byID.Labels.Equal(tt.ls)) {
				t.Fatalf("Lookup(%d) = %+v, %v; want %s, %v", tt.id, byID, ok, tt.ls, tt.wantOK)
			}
			byLabels, ok := a.LookupByLabels(tt.ls)
			if ok != tt.wantOK || (ok && byLabels.ID != tt.id) {
				t.Fatalf("LookupByLabels(%s) = %+v, %v; want %d, %v", tt.ls, byLabels, ok, tt.id, tt.wantOK)
			}
		})
	}
}

// model is a deliberately naive allocator the LocalAllocator is compared to.
type model struct {
	min, max, cursor NumericIdentity
	keys             map[NumericIdentity]string
	refs             map[NumericIdentity]int
}

func (m *model) idOf(key string) (NumericIdentity, bool) {
	for id, k := range m.keys {
		if k == key {
			return id, true
		}
	}
	return 0, false
}

func (m *model) allocate(key string) (NumericIdentity, bool, error) {
	if id, ok := m.idOf(key); ok {
		m.refs[id]++
		return id, false, nil
	}
	for range int(m.max-m.min) + 1 {
		id := m.cursor
		m.cursor++
		if m.cursor > m.max {
			m.cursor = m.min
		}
		if _, taken := m.keys[id]; !taken {
			m.keys[id], m.refs[id] = key, 1
			return id, true, nil
		}
	}
	return 0, false, ErrExhausted
}

func (m *model) release(id NumericIdentity) (bool, error) {
	if id > 0 && id < 256 {
		return false, nil // reserved: a no-op
	}
	if _, ok := m.keys[id]; !ok {
		return false, ErrNotFound
	}
	m.refs[id]--
	if m.refs[id] > 0 {
		return false, nil
	}
	delete(m.keys, id)
	delete(m.refs, id)
	return true, nil
}

// restore assumes key is not a reserved label set.
func (m *model) restore(id NumericIdentity, key string, refs int) error {
	if id < 256 {
		return ErrConflict // a local label set on a reserved number
	}
	if k, ok := m.keys[id]; ok && k != key {
		return ErrConflict
	}
	if other, ok := m.idOf(key); ok && other != id {
		return ErrConflict
	}
	m.keys[id], m.refs[id] = key, refs
	return nil
}

func (m *model) list() []string {
	var out []string
	for id, key := range m.keys {
		out = append(out, fmt.Sprintf("%d %s %d", id, key, m.refs[id]))
	}
	slices.Sort(out)
	return out
}

func listStrings(ids []Identity) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = fmt.Sprintf("%d %s %d", id.ID, id.Labels.Key(), id.RefCount)
	}
	slices.Sort(out)
	return out
}

func TestLocalAllocatorModel(t *testing.T) {
	const minID, maxID = 256, 271 // 16 identities for 24 label sets
	sets := make([]labels.Labels, 24)
	for i := range sets {
		sets[i] = mustLabels(t, fmt.Sprintf("k8s:app=a%d", i), "k8s:zone=z")
	}
	for seed := range uint64(8) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0x5eed))
			a := newAllocator(t, LocalConfig{MinID: minID, MaxID: maxID})
			m := &model{min: minID, max: maxID, cursor: minID,
				keys: map[NumericIdentity]string{}, refs: map[NumericIdentity]int{}}
			const steps = 3000
			for i := range steps {
				modelStep(t, rng, a, m, sets)
				if i%8 != 0 && i != steps-1 {
					continue
				}
				if got, want := listStrings(a.List()), m.list(); !slices.Equal(got, want) {
					t.Fatalf("step %d: List() = %q, model %q", i, got, want)
				}
			}
		})
	}
}

// modelStep applies one random operation to a and m and compares results.
func modelStep(tb testing.TB, rng *rand.Rand, a *LocalAllocator, m *model, sets []labels.Labels) {
	tb.Helper()
	ls := sets[rng.IntN(len(sets))]
	// IDs around the range, some outside it.
	id := NumericIdentity(rng.IntN(int(m.max-m.min)+5)) + m.min - 2
	switch op := rng.IntN(100); {
	case op < 50:
		got, isNew, err := a.Allocate(ls)
		wantID, wantNew, wantErr := m.allocate(ls.Key())
		if got.ID != wantID || isNew != wantNew || !errors.Is(err, wantErr) {
			tb.Fatalf("Allocate(%s) = %d, %v, %v; model %d, %v, %v", ls, got.ID, isNew, err, wantID, wantNew, wantErr)
		}
	case op < 90:
		got, err := a.Release(id)
		want, wantErr := m.release(id)
		if got != want || !errors.Is(err, wantErr) {
			tb.Fatalf("Release(%d) = %v, %v; model %v, %v", id, got, err, want, wantErr)
		}
	case op < 95:
		refs := 1 + rng.IntN(3)
		err := a.Restore(Identity{ID: id, Labels: ls, RefCount: refs})
		if wantErr := m.restore(id, ls.Key(), refs); !errors.Is(err, wantErr) {
			tb.Fatalf("Restore(%d, %s) = %v; model %v", id, ls, err, wantErr)
		}
	default:
		got, ok := a.LookupByLabels(ls)
		wantID, wantOK := m.idOf(ls.Key())
		if ok != wantOK || got.ID != wantID || (ok && got.RefCount != m.refs[wantID]) {
			tb.Fatalf("LookupByLabels(%s) = %+v, %v; model %d, %v", ls, got, ok, wantID, wantOK)
		}
	}
}

func BenchmarkAllocateRelease(b *testing.B) {
	sets := make([]labels.Labels, 1000)
	for i := range sets {
		sets[i] = mustLabels(b, fmt.Sprintf("k8s:app=app-%d", i),
			"k8s:io.kubernetes.pod.namespace=default", "k8s:tier=backend")
	}
	// new: every Allocate creates an identity and every Release frees it.
	b.Run("new", func(b *testing.B) {
		a := newAllocator(b, LocalConfig{})
		b.ReportAllocs()
		for b.Loop() {
			allocateReleaseAll(b, a, sets)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(sets)), "ns/pair")
	})
	// existing: the sets stay bound; Allocate and Release only count.
	b.Run("existing", func(b *testing.B) {
		a := newAllocator(b, LocalConfig{})
		for _, ls := range sets {
			if _, _, err := a.Allocate(ls); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportAllocs()
		for b.Loop() {
			allocateReleaseAll(b, a, sets)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(sets)), "ns/pair")
	})
}

// allocateReleaseAll allocates every set, then releases each once.
func allocateReleaseAll(tb testing.TB, a *LocalAllocator, sets []labels.Labels) {
	tb.Helper()
	ids := make([]NumericIdentity, 0, len(sets))
	for _, ls := range sets {
		id, _, err := a.Allocate(ls)
		if err != nil {
			tb.Fatal(err)
		}
		ids = append(ids, id.ID)
	}
	for _, id := range ids {
		if _, err := a.Release(id); err != nil {
			tb.Fatal(err)
		}
	}
}
