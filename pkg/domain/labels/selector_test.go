package labels

import (
	"errors"
	"testing"
)

func TestSelector(t *testing.T) {
	web := mustSet(t, "k8s:app=web", "k8s:tier=frontend")
	db := mustSet(t, "k8s:app=db", "k8s:tier=db", "container:canary")
	tests := []struct {
		sel       string
		web, db   bool
		canonical string
	}{
		{sel: "", web: true, db: true, canonical: ""},
		{sel: "app=web", web: true, canonical: "app=web"},
		{sel: "app==web", web: true, canonical: "app=web"},
		{sel: "app=web,tier!=db", web: true, canonical: "app=web,tier!=db"},
		{sel: " tier != db ", web: true, canonical: "tier!=db"},
		{sel: "tier!=db", web: true, canonical: "tier!=db"},
		{sel: "k8s:app=db", db: true, canonical: "k8s:app=db"},
		{sel: "container:app=db", canonical: "container:app=db"},
		{sel: "canary", db: true, canonical: "canary"},
		{sel: "!canary", web: true, canonical: "!canary"},
		{sel: "k8s:canary", canonical: "k8s:canary"},
		{sel: "missing!=x", web: true, db: true, canonical: "missing!=x"},
		{sel: "app", web: true, db: true, canonical: "app"},
	}
	for _, tc := range tests {
		t.Run(tc.sel, func(t *testing.T) {
			sel, err := ParseSelector(tc.sel)
			if err != nil {
				t.Fatal(err)
			}
			if got := sel.Matches(web); got != tc.web {
				t.Errorf("matches web = %v, want %v", got, tc.web)
			}
			if got := sel.Matches(db); got != tc.db {
				t.Errorf("matches db = %v, want %v", got, tc.db)
			}
			if got := sel.String(); got != tc.canonical {
				t.Errorf("String = %q, want %q", got, tc.canonical)
			}
		})
	}
}

func TestSelectorInvalid(t *testing.T) {
	for _, s := range []string{"app=web,", ",", "=web", "!", "Bad Source:app=x", "app=a;b", "a b=c", "app=x!=y", "!app=web", "\xff"} {
		t.Run(s, func(t *testing.T) {
			if _, err := ParseSelector(s); !errors.Is(err, ErrInvalidLabel) {
				t.Fatalf("ParseSelector(%q) = %v, want ErrInvalidLabel", s, err)
			}
		})
	}
}

func mustSet(t *testing.T, ss ...string) Labels {
	t.Helper()
	ls, err := ParseSet(ss)
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

func FuzzParseSelector(f *testing.F) {
	for _, s := range []string{"app=web,tier!=db", "k8s:app", "!canary", "a==b", "", "x!=,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sel, err := ParseSelector(s)
		if err != nil {
			return
		}
		again, err := ParseSelector(sel.String())
		if err != nil {
			t.Fatalf("String() of %q = %q does not parse: %v", s, sel.String(), err)
		}
		if again.String() != sel.String() {
			t.Fatalf("round trip of %q: %q then %q", s, sel.String(), again.String())
		}
	})
}
