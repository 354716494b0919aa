package labels

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Operator is a selector requirement's comparison.
type Operator int

// Operators of a Requirement.
const (
	// OpEquals: "key=value" or "key==value"; the label is present with the value.
	OpEquals Operator = iota
	// OpNotEquals: "key!=value"; no label with the key has the value (an
	// absent key matches, as in Kubernetes).
	OpNotEquals
	// OpExists: "key"; a label with the key is present.
	OpExists
	// OpNotExists: "!key"; no label with the key is present.
	OpNotExists
)

// Requirement is one term of a Selector. An empty Source matches labels of
// any source.
type Requirement struct {
	Source, Key, Value string
	Op                 Operator
}

// Selector is a conjunction of requirements, parsed from a Kubernetes-style
// equality selector such as "app=web,tier!=db,k8s:env,!canary".
type Selector []Requirement

// ParseSelector parses a comma-separated list of requirements: key=value,
// key==value, key!=value, key (exists) and !key (does not exist). A key
// may carry a source ("k8s:app=web"); without one it matches any source.
// An empty string is the empty selector, which matches everything.
//
// Returns ErrInvalidLabel naming the bad term if a term is empty, a source,
// key or value is invalid (see Label.Validate), or s is not valid UTF-8.
func ParseSelector(s string) (Selector, error) {
	if !utf8.ValidString(s) {
		return nil, fmt.Errorf("parse selector %q: not valid UTF-8: %w", Clip(s), ErrInvalidLabel)
	}
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var sel Selector
	for _, term := range strings.Split(s, ",") {
		r, err := parseRequirement(strings.TrimSpace(term))
		if err != nil {
			return nil, fmt.Errorf("parse selector %q: %w", Clip(s), err)
		}
		sel = append(sel, r)
	}
	return sel, nil
}

func parseRequirement(t string) (Requirement, error) {
	var r Requirement
	if t == "" {
		return r, fmt.Errorf("empty term: %w", ErrInvalidLabel)
	}
	key := t
	switch {
	case strings.HasPrefix(t, "!"):
		r.Op, key = OpNotExists, t[1:]
	case strings.Contains(t, "!="):
		r.Op = OpNotEquals
		key, r.Value, _ = strings.Cut(t, "!=")
	case strings.Contains(t, "=="):
		key, r.Value, _ = strings.Cut(t, "==")
	case strings.Contains(t, "="):
		key, r.Value, _ = strings.Cut(t, "=")
	default:
		r.Op = OpExists
	}
	if src, k, ok := strings.Cut(key, ":"); ok {
		if err := validateSource(src); err != nil {
			return r, fmt.Errorf("term %q: %w", Clip(t), err)
		}
		r.Source, key = src, k
	}
	r.Key = strings.TrimSpace(key)
	r.Value = strings.TrimSpace(r.Value)
	if err := validateKey(r.Key); err != nil {
		return r, fmt.Errorf("term %q: %w", Clip(t), err)
	}
	if err := validateValue(r.Value); err != nil {
		return r, fmt.Errorf("term %q: %w", Clip(t), err)
	}
	if strings.ContainsAny(r.Value, ",!=") || strings.ContainsAny(r.Key, ":!") {
		return r, fmt.Errorf("term %q: a key or value holds a selector operator: %w", Clip(t), ErrInvalidLabel)
	}
	return r, nil
}

// String returns the selector in the syntax ParseSelector reads.
func (sel Selector) String() string {
	terms := make([]string, len(sel))
	for i, r := range sel {
		key := r.Key
		if r.Source != "" {
			key = r.Source + ":" + key
		}
		switch r.Op {
		case OpEquals:
			terms[i] = key + "=" + r.Value
		case OpNotEquals:
			terms[i] = key + "!=" + r.Value
		case OpExists:
			terms[i] = key
		case OpNotExists:
			terms[i] = "!" + key
		}
	}
	return strings.Join(terms, ",")
}

// Matches reports whether ls satisfies every requirement.
func (sel Selector) Matches(ls Labels) bool {
	for _, r := range sel {
		if !r.matches(ls) {
			return false
		}
	}
	return true
}

func (r Requirement) matches(ls Labels) bool {
	present, equal := false, false
	for _, l := range ls {
		if l.Key != r.Key || (r.Source != "" && r.Source != SourceAny && l.Source != r.Source) {
			continue
		}
		present = true
		if l.Value == r.Value {
			equal = true
		}
	}
	switch r.Op {
	case OpEquals:
		return equal
	case OpNotEquals:
		return !equal
	case OpExists:
		return present
	default:
		return !present
	}
}
