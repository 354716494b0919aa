package actors

import "errors"

var (
	// ErrEndpointExists is returned when creating an endpoint whose ID,
	// container ID or address is already in use.
	ErrEndpointExists = errors.New("endpoint already exists")
	// ErrEndpointNotFound is returned for an unknown endpoint ID.
	ErrEndpointNotFound = errors.New("endpoint not found")
	// ErrEndpointDeleting is returned for a request on an endpoint that is
	// being deleted.
	ErrEndpointDeleting = errors.New("endpoint is being deleted")
	// ErrIDsExhausted is returned when all endpoint IDs 1..65535 are in use.
	ErrIDsExhausted = errors.New("endpoint ids exhausted")
	// ErrIPInUse is returned when releasing an address a live endpoint claimed.
	ErrIPInUse = errors.New("address in use by an endpoint")
	// ErrNoRange is returned when a family or address has no configured range.
	ErrNoRange = errors.New("no address range configured")
	// ErrActorRestarted is returned to callers whose request an actor lost
	// when it restarted after a panic.
	ErrActorRestarted = errors.New("actor restarted")
	// ErrPoolClosed is returned for work submitted after the pool stopped.
	ErrPoolClosed = errors.New("datapath pool closed")
	// ErrStateWrite is wrapped by errors of an endpoint whose state could
	// not be written to (or removed from) the state directory; the
	// underlying error says why (e.g. ENOSPC).
	ErrStateWrite = errors.New("endpoint state not persisted")
	// ErrDatapath is wrapped by errors of a regeneration whose datapath
	// operation (realise) failed; the underlying error says why.
	ErrDatapath = errors.New("datapath operation failed")
	// ErrProxyRejected is wrapped by errors of a regeneration whose proxy
	// configuration the proxy rejected (an xDS NACK).
	ErrProxyRejected = errors.New("proxy rejected the configuration")
	// ErrFQDNNoIdentity is returned for a DNS answer of an endpoint
	// whose identity is not resolved yet.
	ErrFQDNNoIdentity = errors.New("endpoint has no identity yet")
	// ErrStateStays is returned by a delete whose state removal failed:
	// the endpoint is gone from the agent but may come back at the next
	// start, so the delete is not acknowledged.
	ErrStateStays = errors.New("endpoint state could not be removed")
	// ErrIdentityStoreUnavailable is wrapped by the error an identity
	// request gets while the cluster identity store cannot be reached; the
	// identity actor keeps retrying (bounded, with backoff) and the
	// endpoint retries too, so the label set gets its identity when the
	// store is back.
	ErrIdentityStoreUnavailable = errors.New("cluster identity store unavailable")
	// ErrInvalidConfig is wrapped by Config validation errors.
	ErrInvalidConfig = errors.New("invalid actor system config")
)

// crashForTest makes the endpoint, IPAM or identity actor panic, so that
// tests in this package can exercise supervision and rebuild-from-index.
// It is unexported: nothing outside the package can send it.
type crashForTest struct{}
