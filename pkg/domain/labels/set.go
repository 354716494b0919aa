package labels

import (
	"fmt"
	"slices"
	"strings"
)

// Labels is a label set. Sets built by New, ParseSet, Add and Remove are
// sorted by (Source, Key, Value) and hold each (Source, Key) pair at most
// once; Get, Has and Remove rely on that order. A Labels value is never
// modified in place.
type Labels []Label

// New returns the sorted set of ls. Identical duplicates are merged.
//
// Returns ErrInvalidLabel if a label fails Validate, and ErrDuplicateKey if
// two labels share source and key but differ in value.
func New(ls ...Label) (Labels, error) {
	out, err := normalize(ls)
	if err != nil {
		return nil, fmt.Errorf("new label set: %w", err)
	}
	return out, nil
}

// ParseSet parses every string with Parse and returns the sorted set.
// Identical duplicates are merged.
//
// Returns ErrInvalidLabel if a string does not parse, and ErrDuplicateKey,
// naming the source and key, if two strings give one key different values.
func ParseSet(ss []string) (Labels, error) {
	ls := make([]Label, 0, len(ss))
	for _, s := range ss {
		l, err := Parse(s)
		if err != nil {
			return nil, fmt.Errorf("parse label set: %w", err)
		}
		ls = append(ls, l)
	}
	out, err := normalize(ls)
	if err != nil {
		return nil, fmt.Errorf("parse label set: %w", err)
	}
	return out, nil
}

// normalize validates a copy of in, sorts it and merges identical entries.
func normalize(in []Label) (Labels, error) {
	for _, l := range in {
		if err := l.Validate(); err != nil {
			return nil, fmt.Errorf("label %q: %w", Clip(l.String()), err)
		}
	}
	if len(in) == 0 {
		return Labels{}, nil
	}
	out := slices.Clone(in)
	slices.SortFunc(out, compare)
	merged := out[:1]
	for _, l := range out[1:] {
		last := merged[len(merged)-1]
		if l == last {
			continue
		}
		if compareSourceKey(l, last) == 0 {
			return nil, fmt.Errorf("label %s:%s has values %q and %q: %w",
				l.Source, l.Key, last.Value, l.Value, ErrDuplicateKey)
		}
		merged = append(merged, l)
	}
	return merged, nil
}

// compare orders labels by (Source, Key, Value).
func compare(a, b Label) int {
	if c := compareSourceKey(a, b); c != 0 {
		return c
	}
	return strings.Compare(a.Value, b.Value)
}

// compareSourceKey orders labels by (Source, Key), ignoring Value.
func compareSourceKey(a, b Label) int {
	if c := strings.Compare(a.Source, b.Source); c != 0 {
		return c
	}
	return strings.Compare(a.Key, b.Key)
}

// Validate checks the invariants New establishes: every label valid, sorted
// by (Source, Key, Value), no (Source, Key) pair twice. Use it on sets that
// did not come from this package.
//
// Returns ErrInvalidLabel if a label is invalid or the set is not sorted, and
// ErrDuplicateKey if a (Source, Key) pair appears twice.
func (ls Labels) Validate() error {
	for i, l := range ls {
		if err := l.Validate(); err != nil {
			return fmt.Errorf("validate label set: label %q: %w", Clip(l.String()), err)
		}
		if i == 0 {
			continue
		}
		switch c := compareSourceKey(ls[i-1], l); {
		case c == 0:
			return fmt.Errorf("validate label set: %s:%s appears twice: %w", l.Source, l.Key, ErrDuplicateKey)
		case c > 0:
			return fmt.Errorf("validate label set: %q sorts before %q: %w",
				l.String(), ls[i-1].String(), ErrInvalidLabel)
		}
	}
	return nil
}

// Strings returns the String form of every label, in set order.
func (ls Labels) Strings() []string {
	ss := make([]string, len(ls))
	for i, l := range ls {
		ss[i] = l.String()
	}
	return ss
}

// Key returns the canonical form of the set: the sorted String values joined
// by ";". Two valid sets have the same Key exactly when they are Equal, which
// is why keys and values may not contain ';'. This is the key identities are
// allocated for.
func (ls Labels) Key() string {
	if !slices.IsSortedFunc(ls, compareStrings) {
		ss := ls.Strings()
		slices.Sort(ss)
		return strings.Join(ss, ";")
	}
	// The common case: set order is string order, so build the key in one
	// allocation.
	n := len(ls)
	for _, l := range ls {
		n += len(l.Source) + len(l.Key) + len(l.Value) + 1
	}
	var b strings.Builder
	b.Grow(n)
	for i, l := range ls {
		if i > 0 {
			b.WriteByte(';')
		}
		b.WriteString(l.Source)
		b.WriteByte(':')
		b.WriteString(l.Key)
		if l.Value != "" {
			b.WriteByte('=')
			b.WriteString(l.Value)
		}
	}
	return b.String()
}

// compareStrings orders labels as strings.Compare orders their String forms,
// without building them. It differs from compare when one source is a prefix
// of another: "k8s-x:a" sorts before "k8s:a".
func compareStrings(a, b Label) int {
	for i := 0; ; i++ {
		ca, okA := stringByte(a, i)
		cb, okB := stringByte(b, i)
		switch {
		case !okA && !okB:
			return 0
		case !okA:
			return -1
		case !okB:
			return 1
		case ca != cb:
			return int(ca) - int(cb)
		}
	}
}

// stringByte returns byte i of l.String(), or false past its end.
func stringByte(l Label, i int) (byte, bool) {
	if i < len(l.Source) {
		return l.Source[i], true
	}
	if i -= len(l.Source); i == 0 {
		return ':', true
	}
	if i--; i < len(l.Key) {
		return l.Key[i], true
	}
	i -= len(l.Key)
	if l.Value == "" {
		return 0, false
	}
	if i == 0 {
		return '=', true
	}
	if i--; i < len(l.Value) {
		return l.Value[i], true
	}
	return 0, false
}

// String returns the set as its Key.
func (ls Labels) String() string { return ls.Key() }

// Equal reports whether ls and o hold the same labels in the same order.
// An empty set equals a nil one.
func (ls Labels) Equal(o Labels) bool { return slices.Equal(ls, o) }

// Has reports whether ls holds exactly l. The source is compared literally;
// use Matches for SourceAny.
func (ls Labels) Has(l Label) bool {
	v, ok := ls.Get(l.Source, l.Key)
	return ok && v == l.Value
}

// Get returns the value of the label with the given source and key.
func (ls Labels) Get(source, key string) (string, bool) {
	i, ok := slices.BinarySearchFunc(ls, Label{Source: source, Key: key}, compareSourceKey)
	if !ok {
		return "", false
	}
	return ls[i].Value, true
}

// Add returns a new set holding ls and add, where a label of add replaces the
// label of ls with the same source and key. Both sets should come from New or
// ParseSet; add is not validated again.
func (ls Labels) Add(add Labels) Labels {
	out := make(Labels, 0, len(ls)+len(add))
	out = append(out, ls...)
	out = append(out, add...)
	// A stable sort keeps each label of add after the one of ls it replaces,
	// so keeping the last label of every (Source, Key) run lets add win.
	slices.SortStableFunc(out, compareSourceKey)
	res := out[:0]
	for i, l := range out {
		if i+1 < len(out) && compareSourceKey(l, out[i+1]) == 0 {
			continue
		}
		res = append(res, l)
	}
	return res
}

// Remove returns a new set without the labels of ls that del names. A label
// of del with an empty value removes its source and key whatever the value;
// one with a value removes the label only if the value matches too.
func (ls Labels) Remove(del Labels) Labels {
	out := make(Labels, 0, len(ls))
	for _, l := range ls {
		v, ok := del.Get(l.Source, l.Key)
		if ok && (v == "" || v == l.Value) {
			continue
		}
		out = append(out, l)
	}
	return out
}

// Matches reports whether every label of selector is in ls, key and value
// equal. A selector label with source SourceAny matches a label of any
// source. An empty selector matches every set.
func (ls Labels) Matches(selector Labels) bool {
	for _, sel := range selector {
		if sel.Source != SourceAny {
			if !ls.Has(sel) {
				return false
			}
			continue
		}
		if !slices.ContainsFunc(ls, func(l Label) bool {
			return l.Key == sel.Key && l.Value == sel.Value
		}) {
			return false
		}
	}
	return true
}
