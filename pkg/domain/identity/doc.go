// Package identity owns security identities: the numeric identity a label
// set is known by in the datapath and in policy, the fixed reserved
// identities (host, world, unmanaged, health, init), and the Allocator that
// maps label sets to identities with reference counting.
//
// LocalAllocator is the node-local Allocator. It is not goroutine safe: the
// identity actor owns one and is its only caller. A cluster-wide backend
// (etcd) will implement the same Allocator interface.
package identity

import "errors"

var (
	// ErrExhausted is returned by Allocate when every identity in the
	// allocator's range is bound to a label set.
	ErrExhausted = errors.New("identity space exhausted")

	// ErrNotFound is returned by Release for an identity that is not bound.
	ErrNotFound = errors.New("identity not found")

	// ErrInvalidLabels is returned for an empty or malformed label set.
	ErrInvalidLabels = errors.New("invalid identity labels")

	// ErrConflict is returned by Restore when the identity number or the
	// label set is already bound differently, or the number is reserved.
	ErrConflict = errors.New("identity conflict")

	// ErrInvalidIdentity is returned by Restore for identity 0 or a
	// reference count below 1.
	ErrInvalidIdentity = errors.New("invalid identity")

	// ErrInvalidConfig is returned by LocalConfig.Validate and
	// NewLocalAllocator for a config whose fields are out of range.
	ErrInvalidConfig = errors.New("invalid identity allocator config")
)
