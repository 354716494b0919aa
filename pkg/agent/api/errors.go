package api

import (
	"context"
	"errors"
	"net/http"
	"syscall"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// Error codes of the API, in the "code" field of error bodies.
const (
	CodeInvalid           = "invalid-argument"           // 400: bad JSON, unknown or bad field, bad ID
	CodeInvalidAddress    = "invalid-address"            // 400: address outside the pool or reserved
	CodeNotFound          = "not-found"                  // 404
	CodeConflict          = "conflict"                   // 409: duplicate endpoint ID, container or address
	CodeAddressInUse      = "address-in-use"             // 409: address allocated or claimed
	CodeDeleting          = "endpoint-deleting"          // 409: the endpoint is being deleted
	CodeIPAMExhausted     = "ipam-exhausted"             // 507: no free address in the pool
	CodeIDsExhausted      = "endpoint-ids-exhausted"     // 507: all endpoint IDs in use
	CodeIdentityExhausted = "identity-exhausted"         // 507: no free security identity
	CodeStarting          = "starting"                   // 503: the agent is restoring
	CodeShuttingDown      = "shutting-down"              // 503: the agent is stopping
	CodeIdentityStore     = "identity-store-unavailable" // 503: a new label set waits for the cluster identity store; retry
	CodeTimeout           = "timeout"                    // 504: the actors did not answer in time
	CodeDatapath          = "datapath-error"             // 502: realising the endpoint failed
	CodeStateDiskFull     = "state-disk-full"            // 507: the state directory's file system is full
	CodeStateReadOnly     = "state-dir-read-only"        // 507: the state directory's file system is read-only (EROFS)
	CodeStateIOError      = "state-disk-io-error"        // 507: the state directory's device failed a write or flush (EIO)
	CodeStateWrite        = "state-write-failed"         // 500: writing the endpoint's state failed otherwise
	CodeInternal          = "internal"                   // 500
	CodeMethodNotAllowed  = "method-not-allowed"         // 405
	CodeRequestTooLarge   = "request-too-large"          // 413
	CodeBodyTimeout       = "request-timeout"            // 408: the body did not arrive within the body timeout
	CodeUnhealthy         = "endpoint-unhealthy"         // 503: GET /v1/endpoint/{id}/healthz of an unhealthy endpoint
	CodeNetns             = "netns-unavailable"          // 400: POST /v1/attach: the pod's netns cannot be opened or entered
	CodeInterfaceExists   = "interface-exists"           // 409: POST /v1/attach: an interface name stays taken
	CodeKernel            = "kernel-error"               // 500: POST /v1/attach: a netlink or sysctl call failed
	CodeTooManyStreams    = "too-many-streams"           // 429: GET /v1/flows?follow=true with every follower slot taken
	CodeAttachmentBusy    = "attachment-busy"            // 503: POST /v1/attach: an earlier attach of the same attachment stays in flight
)

// apiError is an error with its HTTP status and code.
type apiError struct {
	status  int
	code    string
	message string
}

func (e *apiError) Error() string { return e.message }

func badRequest(msg string) *apiError { return &apiError{http.StatusBadRequest, CodeInvalid, msg} }

func notFound(msg string) *apiError { return &apiError{http.StatusNotFound, CodeNotFound, msg} }

// classify maps an error from the actors or parsers to status and code.
func classify(err error) (int, string) {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return ae.status, ae.code
	case errors.Is(err, actors.ErrEndpointExists):
		return http.StatusConflict, CodeConflict
	case errors.Is(err, policy.ErrInvalidPolicy):
		return http.StatusBadRequest, CodeInvalidPolicy
	case isPolicyNotFound(err):
		return http.StatusNotFound, CodeNotFound
	case errors.Is(err, actors.ErrEndpointNotFound):
		return http.StatusNotFound, CodeNotFound
	case errors.Is(err, actors.ErrEndpointDeleting):
		return http.StatusConflict, CodeDeleting
	case errors.Is(err, actors.ErrIDsExhausted):
		return http.StatusInsufficientStorage, CodeIDsExhausted
	case errors.Is(err, ipam.ErrExhausted):
		return http.StatusInsufficientStorage, CodeIPAMExhausted
	case errors.Is(err, identity.ErrExhausted):
		return http.StatusInsufficientStorage, CodeIdentityExhausted
	case errors.Is(err, ipam.ErrOutOfRange), errors.Is(err, ipam.ErrReserved), errors.Is(err, actors.ErrNoRange):
		return http.StatusBadRequest, CodeInvalidAddress
	case errors.Is(err, ipam.ErrAllocated), errors.Is(err, actors.ErrIPInUse):
		return http.StatusConflict, CodeAddressInUse
	case errors.Is(err, labels.ErrInvalidLabel), errors.Is(err, endpoint.ErrInvalidID), errors.Is(err, identity.ErrInvalidLabels):
		return http.StatusBadRequest, CodeInvalid
	case errors.Is(err, actors.ErrStateWrite) && (errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)):
		return http.StatusInsufficientStorage, CodeStateDiskFull
	case errors.Is(err, actors.ErrStateWrite) && errors.Is(err, syscall.EROFS):
		return http.StatusInsufficientStorage, CodeStateReadOnly
	case errors.Is(err, actors.ErrStateWrite) && errors.Is(err, syscall.EIO):
		return http.StatusInsufficientStorage, CodeStateIOError
	case errors.Is(err, actors.ErrStateWrite):
		return http.StatusInternalServerError, CodeStateWrite
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, CodeTimeout
	case errors.Is(err, actors.ErrIdentityStoreUnavailable):
		return http.StatusServiceUnavailable, CodeIdentityStore
	case errors.Is(err, actors.ErrPoolClosed):
		return http.StatusServiceUnavailable, CodeShuttingDown
	case errors.Is(err, actors.ErrDatapath):
		return http.StatusBadGateway, CodeDatapath
	}
	return http.StatusInternalServerError, CodeInternal
}
