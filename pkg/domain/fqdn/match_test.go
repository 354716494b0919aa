package fqdn

import (
	"errors"
	"strings"
	"testing"
)

func TestMatch(t *testing.T) {
	cases := []struct {
		sel     Selector
		name    string
		matches bool
	}{
		{Selector{MatchName: "allowed.test"}, "allowed.test", true},
		{Selector{MatchName: "allowed.test"}, "ALLOWED.test.", true},
		{Selector{MatchName: "allowed.test"}, "sub.allowed.test", false},
		{Selector{MatchName: "allowed.test."}, "allowed.test", true},
		{Selector{MatchPattern: "*.test"}, "allowed.test", true},
		{Selector{MatchPattern: "*.test"}, "a.b.test", false}, // '*' stays within one label
		{Selector{MatchPattern: "*.test"}, "test", false},
		{Selector{MatchPattern: "a*.test"}, "a.test", true}, // zero characters
		{Selector{MatchPattern: "a*.test"}, "abc-d_1.test", true},
		{Selector{MatchPattern: "a*.test"}, "ba.test", false},
		{Selector{MatchPattern: "*allowed*.test"}, "my-allowed-1.test", true},
		{Selector{MatchPattern: "sub.*.test"}, "sub.x.test", true},
		{Selector{MatchPattern: "sub.*.test"}, "sub.x.y.test", false},
		{Selector{MatchPattern: "*"}, "anything.at.all", true},
		{Selector{MatchPattern: "*"}, ".", true},
		{Selector{MatchPattern: "allowed.test"}, "allowed.test", true},
		{Selector{MatchPattern: "allowed.test"}, "allowedxtest", false}, // '.' is literal
	}
	for _, c := range cases {
		t.Run(c.sel.String()+"/"+c.name, func(t *testing.T) {
			m, err := Compile(c.sel, "sel")
			if err != nil {
				t.Fatal(err)
			}
			if got := m.Matches(c.name); got != c.matches {
				t.Fatalf("Matches(%q) = %v, want %v", c.name, got, c.matches)
			}
		})
	}
}

func TestCompileInvalid(t *testing.T) {
	cases := []struct {
		sel  Selector
		want string
	}{
		{Selector{}, "sel: matchName or matchPattern required"},
		{Selector{MatchName: "a.test", MatchPattern: "*"}, "give one, not both"},
		{Selector{MatchName: "*.test"}, "sel.matchName"},
		{Selector{MatchName: "a..test"}, "empty label"},
		{Selector{MatchName: "a b.test"}, "sel.matchName"},
		{Selector{MatchName: strings.Repeat("a", 64) + ".test"}, "label longer than 63"},
		{Selector{MatchName: strings.Repeat("abcdefghi.", 26)}, "longer than 254"},
		{Selector{MatchPattern: "**.test"}, `"**" is not supported`},
		{Selector{MatchPattern: "a?.test"}, "sel.matchPattern"},
		{Selector{MatchPattern: "a..*"}, "empty label"},
	}
	for _, c := range cases {
		_, err := Compile(c.sel, "sel")
		if err == nil || !errors.Is(err, ErrInvalidName) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Compile(%+v) = %v, want an ErrInvalidName containing %q", c.sel, err, c.want)
		}
	}
}

// FuzzPattern checks that a compiled pattern never panics, that a name
// without '*' matches itself as a pattern, and that a '*' never matches
// across a label.
func FuzzPattern(f *testing.F) {
	for _, s := range []string{"*.test", "a*.b", "*", "allowed.test", "x*y*z.test", "**", ".", "a..b"} {
		f.Add(s, "a.test")
	}
	f.Fuzz(func(t *testing.T, pattern, name string) {
		c, err := Compile(Selector{MatchPattern: pattern}, "p")
		if err != nil {
			return
		}
		got := c.Matches(name)
		if !strings.Contains(pattern, "*") && got != (Normalize(name) == Normalize(pattern)) {
			t.Fatalf("pattern %q without '*': Matches(%q) = %v", pattern, name, got)
		}
		if got && pattern != "*" && strings.Count(Normalize(name), ".") != strings.Count(Normalize(pattern), ".") {
			t.Fatalf("pattern %q matched %q across labels", pattern, name)
		}
	})
}
