package fqdn

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// MaxNameLen is the longest DNS name (RFC 1035, presentation form with
// the trailing dot).
const MaxNameLen = 254

var (
	// ErrInvalidName is wrapped by the errors of ValidateName and Compile.
	ErrInvalidName = errors.New("invalid DNS name")

	nameChars    = regexp.MustCompile(`^[-a-zA-Z0-9_.]+$`)
	patternChars = regexp.MustCompile(`^[-a-zA-Z0-9_.*]+$`)
)

// labelChars is what one '*' of a pattern matches: zero or more valid
// DNS characters of one label (never a '.').
const labelChars = `[-a-zA-Z0-9_]*`

// Normalize returns name lower-cased with a trailing dot (the form the
// selectors and the cache compare).
func Normalize(name string) string {
	name = strings.ToLower(name)
	if !strings.HasSuffix(name, ".") {
		name += "."
	}
	return name
}

// Selector is a toFQDNs entry or a rules.dns entry: MatchName (an exact
// name) or MatchPattern ('*' matches zero or more DNS characters within
// one label; a lone "*" matches every name), both case-insensitive and
// compared in normalized form. Exactly one is set.
type Selector struct {
	MatchName    string `json:"matchName,omitempty"`
	MatchPattern string `json:"matchPattern,omitempty"`
}

// String returns "name:<n>" or "pattern:<p>" (normalized).
func (s Selector) String() string {
	if s.MatchName != "" {
		return "name:" + Normalize(s.MatchName)
	}
	return "pattern:" + Normalize(s.MatchPattern)
}

// Compiled is a validated selector.
type Compiled struct {
	Selector
	name string         // normalized MatchName
	re   *regexp.Regexp // MatchPattern (nil for a lone "*")
	all  bool
}

// Compile validates s; errors name the field below path and wrap
// ErrInvalidName.
func Compile(s Selector, path string) (*Compiled, error) {
	switch {
	case s.MatchName != "" && s.MatchPattern != "":
		return nil, fmt.Errorf("%s: matchName and matchPattern: give one, not both: %w", path, ErrInvalidName)
	case s.MatchName != "":
		if err := ValidateName(s.MatchName); err != nil {
			return nil, fmt.Errorf("%s.matchName: %w", path, err)
		}
		return &Compiled{Selector: s, name: Normalize(s.MatchName)}, nil
	case s.MatchPattern != "":
		re, all, err := compilePattern(s.MatchPattern)
		if err != nil {
			return nil, fmt.Errorf("%s.matchPattern: %w", path, err)
		}
		return &Compiled{Selector: s, re: re, all: all}, nil
	}
	return nil, fmt.Errorf("%s: matchName or matchPattern required: %w", path, ErrInvalidName)
}

// ValidateName checks a matchName (or a queried name): valid DNS
// characters, no empty label, at most MaxNameLen long.
func ValidateName(name string) error {
	if !nameChars.MatchString(name) {
		return fmt.Errorf("%q: want only letters, digits, '-', '_' and '.': %w", name, ErrInvalidName)
	}
	return checkShape(name)
}

func checkShape(name string) error {
	n := Normalize(name)
	if len(n) > MaxNameLen {
		return fmt.Errorf("%q: longer than %d characters: %w", name, MaxNameLen, ErrInvalidName)
	}
	if n == "." {
		return nil
	}
	for _, l := range strings.Split(strings.TrimSuffix(n, "."), ".") {
		if l == "" || len(l) > 63 {
			return fmt.Errorf("%q: empty label or label longer than 63 characters: %w", name, ErrInvalidName)
		}
	}
	return nil
}

func compilePattern(p string) (*regexp.Regexp, bool, error) {
	if !patternChars.MatchString(p) {
		return nil, false, fmt.Errorf("%q: want only letters, digits, '-', '_', '.' and '*': %w", p, ErrInvalidName)
	}
	if strings.Contains(p, "**") {
		return nil, false, fmt.Errorf("%q: \"**\" is not supported (one '*' matches within one label): %w", p, ErrInvalidName)
	}
	if p == "*" {
		return nil, true, nil
	}
	if err := checkShape(strings.ReplaceAll(p, "*", "x")); err != nil {
		return nil, false, err
	}
	parts := strings.Split(Normalize(p), "*")
	for i := range parts {
		parts[i] = regexp.QuoteMeta(parts[i])
	}
	re, err := regexp.Compile("^" + strings.Join(parts, labelChars) + "$")
	if err != nil {
		return nil, false, fmt.Errorf("%q: %w: %w", p, ErrInvalidName, err)
	}
	return re, false, nil
}

// Matches reports whether the (queried or answered) name matches.
func (c *Compiled) Matches(name string) bool {
	n := Normalize(name)
	switch {
	case c.all:
		return true
	case c.re != nil:
		return c.re.MatchString(n)
	}
	return n == c.name
}
