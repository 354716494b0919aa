package policy

import (
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// TestStagingEqualsImport: an import staged one selector per step, with
// identity changes and policy computations between the steps, ends as
// the same import done at once, reports every identity whose policy
// changed, and until Import answers the policy before the import.
func TestStagingEqualsImport(t *testing.T) {
	const a, b, late identity.NumericIdentity = 300, 301, 302
	setup := func() *Repository {
		r := NewRepository()
		r.UpsertIdentity(a, podLabels(t, "default", "app=a"))
		r.UpsertIdentity(b, podLabels(t, "default", "app=b"))
		r.Import(mustParse(t, fuzzPolicies[0])) // a-to-b
		r.MapState(a)
		r.MapState(b)
		return r
	}
	var pols []*Policy
	for _, d := range fuzzPolicies[1:] {
		pols = append(pols, mustParse(t, d)...)
	}

	direct := setup()
	direct.UpsertIdentity(late, podLabels(t, "default", "app=c"))
	direct.MapState(late)
	want := direct.Import(pols)

	staged := setup()
	beforeB := staged.MapState(b)
	s := staged.Stage(pols)
	steps := 0
	for !s.Step(1) {
		steps++
		if steps == 2 {
			staged.UpsertIdentity(late, podLabels(t, "default", "app=c"))
			staged.MapState(late)
		}
		if got := staged.MapState(b); !got.Equal(beforeB) {
			t.Fatalf("step %d: policy of b %+v, want the one before the import %+v", steps, got, beforeB)
		}
	}
	if steps < 3 {
		t.Fatalf("%d steps, want one per selector", steps)
	}
	prev := map[identity.NumericIdentity]*MapState{}
	for _, id := range []identity.NumericIdentity{a, b, late} {
		prev[id] = staged.MapState(id)
	}
	got := s.Import()
	checkAgainstScratch(t, staged, prev, got)
	for _, id := range []identity.NumericIdentity{a, b, late} {
		if g, w := staged.MapState(id), direct.MapState(id); !g.Equal(w) {
			t.Errorf("identity %d: staged %+v, direct %+v", id, g, w)
		}
	}
	if len(got.Changed) != len(want.Changed) || len(staged.CIDRs()) != len(direct.CIDRs()) || staged.Selectors() != direct.Selectors() {
		t.Errorf("staged: %d changed, %d CIDRs, %d selectors; direct: %d, %d, %d",
			len(got.Changed), len(staged.CIDRs()), staged.Selectors(), len(want.Changed), len(direct.CIDRs()), direct.Selectors())
	}
	for _, p := range pols {
		if _, err := staged.DeleteByName(p.Key()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := staged.DeleteByName("default/a-to-b"); err != nil {
		t.Fatal(err)
	}
	if len(staged.CIDRs()) != 0 || staged.Selectors() != 0 {
		t.Errorf("after deleting everything: %v CIDRs, %d selectors (a staging reference leaked)", staged.CIDRs(), staged.Selectors())
	}
}
