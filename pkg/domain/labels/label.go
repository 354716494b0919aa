package labels

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Well-known label sources. Any other source matching [a-z0-9-]+ (for
// example "cidr") is accepted too.
const (
	// SourceK8s marks labels taken from Kubernetes pods and namespaces.
	SourceK8s = "k8s"
	// SourceReserved marks the labels of reserved identities (reserved:host).
	SourceReserved = "reserved"
	// SourceUnspec is the source of a label parsed without one ("app=web").
	SourceUnspec = "unspec"
	// SourceContainer marks labels taken from the container runtime.
	SourceContainer = "container"
	// SourceAny is used in selectors only: it matches a label of any source.
	SourceAny = "any"
)

// maxLen is the longest source, key or value in bytes, the DNS name limit
// Kubernetes uses for label keys.
const maxLen = 253

// Label is one source:key=value label. The zero value is not valid: Source
// and Key must be set (see Validate).
type Label struct {
	Source string
	Key    string
	Value  string
}

// Parse parses "source:key=value", "key=value" (source SourceUnspec),
// "source:key" (empty value) or "key".
//
// As in Cilium, the text before the first ':' is the source only if that ':'
// comes before any '='. So "k8s:app=web" has source k8s, while "app=a:b" has
// source unspec, key "app" and value "a:b". The key ends at the first '='
// after the source; the value may hold further ':' and '=' characters.
//
// Returns ErrInvalidLabel if s is not valid UTF-8 or the parsed label fails
// Validate; the message quotes s and says what is wrong.
func Parse(s string) (Label, error) {
	if !utf8.ValidString(s) {
		return Label{}, fmt.Errorf("parse label %q: not valid UTF-8: %w", Clip(s), ErrInvalidLabel)
	}
	l := split(s)
	if err := l.Validate(); err != nil {
		return Label{}, fmt.Errorf("parse label %q: %w", Clip(s), err)
	}
	return l, nil
}

// clipLen is the longest text an error message quotes whole.
const clipLen = 96

// Clip shortens s for an error message: a text longer than clipLen bytes
// is cut to its first clipLen bytes (never inside a UTF-8 sequence)
// followed by "...(N bytes)", so that a message never echoes a huge input.
func Clip(s string) string {
	if len(s) <= clipLen {
		return s
	}
	cut := clipLen
	for cut > clipLen-utf8.UTFMax && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s...(%d bytes)", s[:cut], len(s))
}

// split divides s into source, key and value without validating them.
func split(s string) Label {
	l := Label{Source: SourceUnspec}
	colon := strings.IndexByte(s, ':')
	eq := strings.IndexByte(s, '=')
	if colon >= 0 && (eq < 0 || colon < eq) {
		l.Source, s = s[:colon], s[colon+1:]
	}
	l.Key, l.Value, _ = strings.Cut(s, "=")
	return l
}

// String returns "source:key=value", or "source:key" when Value is empty.
// For a valid label, Parse(l.String()) returns l.
func (l Label) String() string {
	if l.Value == "" {
		return l.Source + ":" + l.Key
	}
	return l.Source + ":" + l.Key + "=" + l.Value
}

// Validate checks that l can be printed by String and parsed back unchanged,
// and that it cannot make two different label sets share one Key.
//
// Returns ErrInvalidLabel if the source does not match [a-z0-9-]+; if the key
// is empty or holds whitespace, control characters, '=' or ';'; if the value
// holds control characters or ';'; if any field is longer than 253 bytes or
// not valid UTF-8.
func (l Label) Validate() error {
	if err := validateSource(l.Source); err != nil {
		return err
	}
	if err := validateKey(l.Key); err != nil {
		return err
	}
	return validateValue(l.Value)
}

func validateSource(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("empty source: %w", ErrInvalidLabel)
	case len(s) > maxLen:
		return fmt.Errorf("source is %d bytes, longer than %d: %w", len(s), maxLen, ErrInvalidLabel)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return fmt.Errorf("source %q does not match [a-z0-9-]+: %w", s, ErrInvalidLabel)
		}
	}
	return nil
}

func validateKey(k string) error {
	switch {
	case k == "":
		return fmt.Errorf("empty key: %w", ErrInvalidLabel)
	case len(k) > maxLen:
		return fmt.Errorf("key is %d bytes, longer than %d: %w", len(k), maxLen, ErrInvalidLabel)
	case !utf8.ValidString(k):
		return fmt.Errorf("key %q is not valid UTF-8: %w", k, ErrInvalidLabel)
	}
	for _, r := range k {
		switch {
		case unicode.IsSpace(r):
			return fmt.Errorf("key %q contains whitespace: %w", k, ErrInvalidLabel)
		case unicode.IsControl(r):
			return fmt.Errorf("key %q contains control character %U: %w", k, r, ErrInvalidLabel)
		case r == '=' || r == ';':
			return fmt.Errorf("key %q contains %q: %w", k, r, ErrInvalidLabel)
		}
	}
	return nil
}

func validateValue(v string) error {
	switch {
	case len(v) > maxLen:
		return fmt.Errorf("value is %d bytes, longer than %d: %w", len(v), maxLen, ErrInvalidLabel)
	case !utf8.ValidString(v):
		return fmt.Errorf("value %q is not valid UTF-8: %w", v, ErrInvalidLabel)
	}
	for _, r := range v {
		switch {
		case unicode.IsControl(r):
			return fmt.Errorf("value %q contains control character %U: %w", v, r, ErrInvalidLabel)
		case r == ';':
			return fmt.Errorf("value %q contains ';', the label set key separator: %w", v, ErrInvalidLabel)
		}
	}
	return nil
}
