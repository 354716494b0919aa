package labels

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// mustParseSet parses ss or fails the test.
func mustParseSet(tb testing.TB, ss ...string) Labels {
	tb.Helper()
	ls, err := ParseSet(ss)
	if err != nil {
		tb.Fatalf("ParseSet(%q): %v", ss, err)
	}
	return ls
}

func TestParseSet(t *testing.T) {
	tests := []struct {
		name    string
		in      []string
		want    []string // Strings() of the result
		wantErr error
		errHas  string
	}{
		{name: "empty", in: nil, want: []string{}},
		{name: "sorted by source then key",
			in:   []string{"k8s:zone=a", "app=web", "k8s:app=db", "reserved:host"},
			want: []string{"k8s:app=db", "k8s:zone=a", "reserved:host", "unspec:app=web"}},
		{name: "identical duplicates merged",
			in:   []string{"k8s:app=web", "k8s:app=web", "app=web"},
			want: []string{"k8s:app=web", "unspec:app=web"}},
		{name: "same key in two sources",
			in:   []string{"k8s:app=a", "container:app=b"},
			want: []string{"container:app=b", "k8s:app=a"}},
		{name: "conflicting values", in: []string{"k8s:app=web", "k8s:zone=a", "k8s:app=db"},
			wantErr: ErrDuplicateKey, errHas: "k8s:app"},
		{name: "empty and set value conflict", in: []string{"k8s:app", "k8s:app=db"},
			wantErr: ErrDuplicateKey, errHas: "k8s:app"},
		{name: "invalid entry", in: []string{"k8s:app=web", "K8S:x"},
			wantErr: ErrInvalidLabel, errHas: `"K8S:x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseSet(tt.in)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.errHas) {
					t.Fatalf("ParseSet(%q) = %v, %v; want %v naming %q", tt.in, got, err, tt.wantErr, tt.errHas)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseSet(%q): %v", tt.in, err)
			}
			if !slices.Equal(got.Strings(), tt.want) {
				t.Fatalf("ParseSet(%q) = %q, want %q", tt.in, got.Strings(), tt.want)
			}
			if err := got.Validate(); err != nil {
				t.Fatalf("result fails Validate: %v", err)
			}
		})
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		name    string
		in      []Label
		want    string // Key()
		wantErr error
	}{
		{"sorts", []Label{{"k8s", "b", "1"}, {"k8s", "a", "2"}}, "k8s:a=2;k8s:b=1", nil},
		{"merges identical", []Label{{"k8s", "a", "1"}, {"k8s", "a", "1"}}, "k8s:a=1", nil},
		{"conflict", []Label{{"k8s", "a", "1"}, {"k8s", "a", "2"}}, "", ErrDuplicateKey},
		{"zero source is invalid", []Label{{Key: "a"}}, "", ErrInvalidLabel},
		{"equals in key", []Label{{"k8s", "a=b", ""}}, "", ErrInvalidLabel},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := New(tt.in...)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("New(%v) error %v, want %v", tt.in, err, tt.wantErr)
			}
			if err == nil && got.Key() != tt.want {
				t.Fatalf("New(%v).Key() = %q, want %q", tt.in, got.Key(), tt.want)
			}
		})
	}
}

func TestValidateSet(t *testing.T) {
	tests := []struct {
		name    string
		ls      Labels
		wantErr error
	}{
		{"empty", nil, nil},
		{"sorted", Labels{{"k8s", "a", ""}, {"k8s", "b", ""}}, nil},
		{"unsorted", Labels{{"k8s", "b", ""}, {"k8s", "a", ""}}, ErrInvalidLabel},
		{"duplicate", Labels{{"k8s", "a", "1"}, {"k8s", "a", "2"}}, ErrDuplicateKey},
		{"invalid label", Labels{{"k8s", "", ""}}, ErrInvalidLabel},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.ls.Validate(); !errors.Is(err, tt.wantErr) {
				t.Fatalf("Validate() = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestKey(t *testing.T) {
	tests := []struct {
		name string
		in   []string
		want string
	}{
		{"empty", nil, ""},
		{"one", []string{"reserved:host"}, "reserved:host"},
		{"order independent", []string{"k8s:b=2", "app=x", "k8s:a=1"}, "k8s:a=1;k8s:b=2;unspec:app=x"},
		{"same set other order", []string{"k8s:a=1", "k8s:b=2", "app=x"}, "k8s:a=1;k8s:b=2;unspec:app=x"},
		// String order and (Source, Key) order differ here ('-' < ':'):
		// Key sorts the strings, so it does not depend on the tuple order.
		{"string order", []string{"k8s-x:a", "k8s:a"}, "k8s-x:a;k8s:a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ls := mustParseSet(t, tt.in...)
			if got := ls.Key(); got != tt.want {
				t.Fatalf("Key() = %q, want %q", got, tt.want)
			}
			rev := slices.Clone(tt.in)
			slices.Reverse(rev)
			if got := mustParseSet(t, rev...).Key(); got != tt.want {
				t.Fatalf("Key() of reversed input = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestCompareStrings(t *testing.T) {
	all := []Label{
		{"k8s", "a", ""}, {"k8s", "a", "1"}, {"k8s", "a", "="}, {"k8s", "ab", ""},
		{"k8s", "a=", ""}, {"k8s-x", "a", ""}, {"k8", "s:a", ""}, {"k", "8s", "x"},
		{"unspec", "app", "web"}, {"unspec", "app", ""}, {"a", "b", "c"},
	}
	for _, a := range all {
		for _, b := range all {
			t.Run(a.String()+" vs "+b.String(), func(t *testing.T) {
				want := strings.Compare(a.String(), b.String())
				if got := compareStrings(a, b); sign(got) != want {
					t.Fatalf("compareStrings = %d, want sign %d", got, want)
				}
			})
		}
	}
}

func sign(n int) int {
	switch {
	case n < 0:
		return -1
	case n > 0:
		return 1
	}
	return 0
}

func TestGetHasEqual(t *testing.T) {
	ls := mustParseSet(t, "k8s:app=web", "reserved:host", "app=x")
	tests := []struct {
		source, key string
		wantValue   string
		wantOK      bool
	}{
		{"k8s", "app", "web", true},
		{"reserved", "host", "", true},
		{"unspec", "app", "x", true},
		{"k8s", "zone", "", false},
		{"any", "app", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.source+":"+tt.key, func(t *testing.T) {
			v, ok := ls.Get(tt.source, tt.key)
			if v != tt.wantValue || ok != tt.wantOK {
				t.Fatalf("Get(%q, %q) = %q, %v; want %q, %v", tt.source, tt.key, v, ok, tt.wantValue, tt.wantOK)
			}
			l := Label{tt.source, tt.key, tt.wantValue}
			if got := ls.Has(l); got != tt.wantOK {
				t.Fatalf("Has(%v) = %v, want %v", l, got, tt.wantOK)
			}
		})
	}
	if ls.Has(Label{"k8s", "app", "db"}) {
		t.Error("Has matched a different value")
	}
	if !ls.Equal(mustParseSet(t, "app=x", "reserved:host", "k8s:app=web")) {
		t.Error("Equal is false for the same set")
	}
	if ls.Equal(mustParseSet(t, "k8s:app=web")) || !Labels(nil).Equal(Labels{}) {
		t.Error("Equal is wrong for different or empty sets")
	}
}

func TestAdd(t *testing.T) {
	tests := []struct {
		name      string
		base, add []string
		want      string
	}{
		{"into empty", nil, []string{"k8s:a=1"}, "k8s:a=1"},
		{"nothing", []string{"k8s:a=1"}, nil, "k8s:a=1"},
		{"new keys interleave", []string{"k8s:a=1", "k8s:c=3"}, []string{"k8s:b=2", "unspec:d"}, "k8s:a=1;k8s:b=2;k8s:c=3;unspec:d"},
		{"replaces value", []string{"k8s:a=1", "k8s:b=2"}, []string{"k8s:a=9"}, "k8s:a=9;k8s:b=2"},
		{"replaces with empty value", []string{"k8s:a=1"}, []string{"k8s:a"}, "k8s:a"},
		{"other source kept", []string{"k8s:a=1"}, []string{"container:a=2"}, "container:a=2;k8s:a=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := mustParseSet(t, tt.base...)
			before := slices.Clone(base)
			got := base.Add(mustParseSet(t, tt.add...))
			if got.Key() != tt.want {
				t.Fatalf("Add = %q, want %q", got.Key(), tt.want)
			}
			if err := got.Validate(); err != nil {
				t.Fatalf("Add result fails Validate: %v", err)
			}
			if !base.Equal(before) {
				t.Fatalf("Add modified its receiver: %v, was %v", base, before)
			}
		})
	}
}

func TestRemove(t *testing.T) {
	tests := []struct {
		name      string
		base, del []string
		want      string
	}{
		{"empty value removes any value", []string{"k8s:a=1", "k8s:b=2"}, []string{"k8s:a"}, "k8s:b=2"},
		{"matching value removes", []string{"k8s:a=1", "k8s:b=2"}, []string{"k8s:a=1"}, "k8s:b=2"},
		{"other value keeps", []string{"k8s:a=1", "k8s:b=2"}, []string{"k8s:a=9"}, "k8s:a=1;k8s:b=2"},
		{"other source keeps", []string{"k8s:a=1"}, []string{"container:a"}, "k8s:a=1"},
		{"missing key", []string{"k8s:a=1"}, []string{"k8s:z"}, "k8s:a=1"},
		{"all", []string{"k8s:a=1", "reserved:host"}, []string{"reserved:host", "k8s:a"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := mustParseSet(t, tt.base...)
			before := slices.Clone(base)
			got := base.Remove(mustParseSet(t, tt.del...))
			if got.Key() != tt.want {
				t.Fatalf("Remove = %q, want %q", got.Key(), tt.want)
			}
			if !base.Equal(before) {
				t.Fatalf("Remove modified its receiver: %v, was %v", base, before)
			}
		})
	}
}

func TestMatches(t *testing.T) {
	ls := mustParseSet(t, "k8s:app=web", "k8s:io.kubernetes.pod.namespace=default", "container:tier=front")
	tests := []struct {
		name     string
		selector []string
		want     bool
	}{
		{"empty selector", nil, true},
		{"one label", []string{"k8s:app=web"}, true},
		{"all labels", []string{"k8s:app=web", "k8s:io.kubernetes.pod.namespace=default", "container:tier=front"}, true},
		{"wrong value", []string{"k8s:app=db"}, false},
		{"empty value is not a wildcard", []string{"k8s:app"}, false},
		{"wrong source", []string{"container:app=web"}, false},
		{"any source", []string{"any:app=web"}, true},
		{"any source other label", []string{"any:tier=front", "k8s:app=web"}, true},
		{"any source wrong value", []string{"any:tier=back"}, false},
		{"one missing", []string{"k8s:app=web", "k8s:zone=a"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ls.Matches(mustParseSet(t, tt.selector...)); got != tt.want {
				t.Fatalf("Matches(%q) = %v, want %v", tt.selector, got, tt.want)
			}
		})
	}
}

func FuzzParseSet(f *testing.F) {
	f.Add("k8s:app=web\nreserved:host\napp=a:b")
	f.Add("k8s:a=1\nk8s:a=1\nk8s-x:a")
	f.Add("k8s:a=1\nk8s:a=2")
	f.Add("cidr:10.0.0.0/8\nany:x\n")
	f.Fuzz(func(t *testing.T, in string) {
		ls, err := ParseSet(strings.Split(in, "\n"))
		if err != nil {
			if !errors.Is(err, ErrInvalidLabel) && !errors.Is(err, ErrDuplicateKey) {
				t.Fatalf("ParseSet error %v wraps no sentinel", err)
			}
			return
		}
		if err := ls.Validate(); err != nil {
			t.Fatalf("ParseSet(%q) = %v, which fails Validate: %v", in, ls, err)
		}
		ss := ls.Strings()
		sorted := slices.Clone(ss)
		slices.Sort(sorted)
		if want := strings.Join(sorted, ";"); ls.Key() != want {
			t.Fatalf("Key() = %q, want sorted strings %q", ls.Key(), want)
		}
		again, err := ParseSet(ss)
		if err != nil {
			t.Fatalf("ParseSet(%q) (from %q): %v", ss, in, err)
		}
		if !again.Equal(ls) || again.Key() != ls.Key() {
			t.Fatalf("re-parse of %q: key %q, want %q", ss, again.Key(), ls.Key())
		}
		slices.Reverse(ss)
		if rev, err := ParseSet(ss); err != nil || rev.Key() != ls.Key() {
			t.Fatalf("reversed re-parse of %q: %v, %v; want key %q", ss, rev, err, ls.Key())
		}
	})
}
