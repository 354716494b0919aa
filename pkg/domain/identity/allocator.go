package identity

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// Allocator maps label sets to identities with reference counting.
// Implementations need not be goroutine safe. Label sets are compared by
// labels.Labels.Key.
type Allocator interface {
	// Allocate returns the identity for ls, creating it if needed, and takes
	// one reference; isNew reports whether it was created. A reserved label
	// set (see LookupReserved) returns its reserved identity with isNew false
	// and no reference taken.
	//
	// Returns ErrInvalidLabels if ls is empty or malformed, and ErrExhausted
	// if no identity is free.
	Allocate(ls labels.Labels) (id Identity, isNew bool, err error)

	// Release drops one reference to id; when the last one goes the identity
	// is freed and released is true. Releasing a reserved identity is a
	// no-op.
	//
	// Returns ErrNotFound if id is not bound.
	Release(id NumericIdentity) (released bool, err error)

	// Lookup returns the identity bound to id, reserved ones included.
	Lookup(id NumericIdentity) (Identity, bool)

	// LookupByLabels returns the identity bound to ls, reserved ones included.
	LookupByLabels(ls labels.Labels) (Identity, bool)

	// Restore re-creates an identity with the given ID, labels and RefCount,
	// as when the owning actor restarts and rebuilds from the index.
	// Restoring a binding that already exists sets its RefCount; restoring a
	// reserved identity with its own labels is a no-op.
	//
	// Returns ErrConflict if the ID or label set is already bound
	// differently, ErrInvalidLabels for an empty or malformed label set, and
	// ErrInvalidIdentity for ID 0 or a RefCount below 1.
	Restore(id Identity) error

	// List returns the allocated identities sorted by ID; reserved
	// identities are not included.
	List() []Identity
}

var _ Allocator = (*LocalAllocator)(nil)

// defaultMaxID is the last identity of the default range: the 16-bit
// identity space Cilium uses for cluster identities.
const defaultMaxID NumericIdentity = 65535

// LocalConfig configures a LocalAllocator. The zero value gives the range
// MinLocalIdentity (256) to 65535.
type LocalConfig struct {
	// MinID is the first identity handed out; 0 means MinLocalIdentity. It
	// must not be below MinLocalIdentity, so that no label set is ever given
	// a reserved identity.
	MinID NumericIdentity
	// MaxID is the last identity handed out; 0 means 65535. It must not be
	// below MinID.
	MaxID NumericIdentity
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c LocalConfig) withDefaults() LocalConfig {
	if c.MinID == 0 {
		c.MinID = MinLocalIdentity
	}
	if c.MaxID == 0 {
		c.MaxID = defaultMaxID
	}
	return c
}

// Validate checks c after applying defaults.
//
// Returns ErrInvalidConfig, naming the field, if MinID is below
// MinLocalIdentity or MaxID is below MinID.
func (c LocalConfig) Validate() error {
	c = c.withDefaults()
	switch {
	case c.MinID < MinLocalIdentity:
		return fmt.Errorf("validate local config: MinID %d is below MinLocalIdentity %d: %w",
			c.MinID, MinLocalIdentity, ErrInvalidConfig)
	case c.MaxID < c.MinID:
		return fmt.Errorf("validate local config: MaxID %d is below MinID %d: %w",
			c.MaxID, c.MinID, ErrInvalidConfig)
	}
	return nil
}

// LocalAllocator is the node-local Allocator. It hands out identities from
// MinID upward with a cursor that wraps at MaxID: an identity freed behind
// the cursor is reused only after the cursor wraps, so a freed number is not
// immediately bound to different labels.
//
// Allocation costs one map probe per identity the cursor passes. The cursor
// only moves forward and, apart from Restore, only binds where it stands, so
// a revolution skips at most the identities bound when it began: while at
// most a fraction f of the range is bound, Allocate is amortised O(1) with
// under f/(1-f) skips per call. A full range fails in O(1).
//
// A LocalAllocator is not goroutine safe.
type LocalAllocator struct {
	minID, maxID NumericIdentity
	// cursor is the next identity to try.
	cursor NumericIdentity
	// free counts identities in [minID, maxID] not bound to a label set.
	free uint64
	// byID holds every bound identity, including restored ones outside the
	// range; the entries are updated in place.
	byID map[NumericIdentity]*entry
	// byKey maps labels.Labels.Key to the identity bound to it.
	byKey map[string]NumericIdentity
}

// entry is a bound identity and the Key of its labels.
type entry struct {
	Identity
	key string
}

// NewLocalAllocator returns an empty LocalAllocator for cfg.
//
// Returns ErrInvalidConfig if cfg fails Validate.
func NewLocalAllocator(cfg LocalConfig) (*LocalAllocator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new local allocator: %w", err)
	}
	cfg = cfg.withDefaults()
	return &LocalAllocator{
		minID:  cfg.MinID,
		maxID:  cfg.MaxID,
		cursor: cfg.MinID,
		free:   uint64(cfg.MaxID-cfg.MinID) + 1,
		byID:   make(map[NumericIdentity]*entry),
		byKey:  make(map[string]NumericIdentity),
	}, nil
}

// Allocate implements Allocator.
func (a *LocalAllocator) Allocate(ls labels.Labels) (Identity, bool, error) {
	if err := validateLabels(ls); err != nil {
		return Identity{}, false, fmt.Errorf("allocate identity: %w", err)
	}
	if id, ok := LookupReserved(ls); ok {
		return reservedIdentity(id), false, nil
	}
	key := ls.Key()
	if id, ok := a.byKey[key]; ok {
		e := a.byID[id]
		e.RefCount++
		return e.Identity, false, nil
	}
	id, ok := a.nextFree()
	if !ok {
		return Identity{}, false, fmt.Errorf("allocate identity for %s: all of %d..%d bound: %w",
			key, a.minID, a.maxID, ErrExhausted)
	}
	e := &entry{Identity{ID: id, Labels: slices.Clone(ls), RefCount: 1}, key}
	a.bind(e)
	return e.Identity, true, nil
}

// validateLabels checks that ls is a non-empty, well-formed label set.
func validateLabels(ls labels.Labels) error {
	if len(ls) == 0 {
		return fmt.Errorf("empty label set: %w", ErrInvalidLabels)
	}
	if err := ls.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidLabels, err)
	}
	return nil
}

// nextFree returns the first unbound identity at or after the cursor,
// wrapping at maxID, and moves the cursor past it. It returns false when the
// range is full.
func (a *LocalAllocator) nextFree() (NumericIdentity, bool) {
	if a.free == 0 {
		return IdentityUnknown, false
	}
	for {
		id := a.cursor
		if a.cursor == a.maxID {
			a.cursor = a.minID
		} else {
			a.cursor++
		}
		if _, taken := a.byID[id]; !taken {
			return id, true
		}
	}
}

// inRange reports whether id is one the cursor hands out.
func (a *LocalAllocator) inRange(id NumericIdentity) bool {
	return id >= a.minID && id <= a.maxID
}

// bind records e under its ID and key.
func (a *LocalAllocator) bind(e *entry) {
	a.byID[e.ID] = e
	a.byKey[e.key] = e.ID
	if a.inRange(e.ID) {
		a.free--
	}
}

// Release implements Allocator.
func (a *LocalAllocator) Release(id NumericIdentity) (bool, error) {
	if id.IsReserved() {
		return false, nil
	}
	e, ok := a.byID[id]
	if !ok {
		return false, fmt.Errorf("release identity %d: %w", id, ErrNotFound)
	}
	e.RefCount--
	if e.RefCount > 0 {
		return false, nil
	}
	delete(a.byID, id)
	delete(a.byKey, e.key)
	if a.inRange(id) {
		a.free++
	}
	return true, nil
}

// Lookup implements Allocator.
func (a *LocalAllocator) Lookup(id NumericIdentity) (Identity, bool) {
	if _, ok := ReservedLabels(id); ok {
		return reservedIdentity(id), true
	}
	e, ok := a.byID[id]
	if !ok {
		return Identity{}, false
	}
	return e.Identity, true
}

// LookupByLabels implements Allocator.
func (a *LocalAllocator) LookupByLabels(ls labels.Labels) (Identity, bool) {
	if id, ok := LookupReserved(ls); ok {
		return reservedIdentity(id), true
	}
	id, ok := a.byKey[ls.Key()]
	if !ok {
		return Identity{}, false
	}
	return a.byID[id].Identity, true
}

// Restore implements Allocator. An identity outside MinID..MaxID is
// accepted, so a narrower range after a restart does not drop identities
// still in use; the cursor never hands such an identity out.
func (a *LocalAllocator) Restore(id Identity) error {
	if err := a.checkRestore(id); err != nil {
		return fmt.Errorf("restore identity %d: %w", id.ID, err)
	}
	if id.ID.IsReserved() {
		return nil
	}
	if e, ok := a.byID[id.ID]; ok {
		e.RefCount = id.RefCount
		return nil
	}
	e := &entry{Identity{ID: id.ID, Labels: slices.Clone(id.Labels), RefCount: id.RefCount}, id.Labels.Key()}
	a.bind(e)
	return nil
}

// checkRestore returns why id cannot be restored, or nil if it can.
func (a *LocalAllocator) checkRestore(id Identity) error {
	if err := validateLabels(id.Labels); err != nil {
		return err
	}
	if id.ID == IdentityUnknown || id.RefCount < 1 {
		return fmt.Errorf("ID %d with RefCount %d: %w", id.ID, id.RefCount, ErrInvalidIdentity)
	}
	key := id.Labels.Key()
	if id.ID.IsReserved() {
		if want, ok := ReservedLabels(id.ID); !ok || !want.Equal(id.Labels) {
			return fmt.Errorf("labels %s for reserved identity %d: %w", key, id.ID, ErrConflict)
		}
		return nil
	}
	if rid, ok := LookupReserved(id.Labels); ok {
		return fmt.Errorf("labels %s belong to reserved identity %d: %w", key, rid, ErrConflict)
	}
	if e, ok := a.byID[id.ID]; ok && e.key != key {
		return fmt.Errorf("bound to %s, not %s: %w", e.key, key, ErrConflict)
	}
	if other, ok := a.byKey[key]; ok && other != id.ID {
		return fmt.Errorf("labels %s bound to identity %d: %w", key, other, ErrConflict)
	}
	return nil
}

// List implements Allocator.
func (a *LocalAllocator) List() []Identity {
	out := make([]Identity, 0, len(a.byID))
	for _, e := range a.byID {
		out = append(out, e.Identity)
	}
	slices.SortFunc(out, func(x, y Identity) int { return cmp.Compare(x.ID, y.ID) })
	return out
}
