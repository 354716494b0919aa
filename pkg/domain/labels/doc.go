// Package labels owns the Cilium-style label model: parsing "source:key=value"
// strings into a Label, validating them, and the canonical sorted label set
// (Labels) whose Key is the string a security identity is allocated for.
//
// A Labels value is never modified in place: Add and Remove return new sets,
// so a set handed to another component can be shared without copying.
package labels

import "errors"

var (
	// ErrInvalidLabel is returned when a label is malformed: an empty key, a
	// source outside [a-z0-9-]+, whitespace or control characters, a ';' or an
	// over-long field, or input that is not valid UTF-8.
	ErrInvalidLabel = errors.New("invalid label")

	// ErrDuplicateKey is returned when a label set holds the same source and
	// key twice with different values.
	ErrDuplicateKey = errors.New("duplicate label key")
)
