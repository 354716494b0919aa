package sim

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"

	"github.com/membrane-cni/membrane/pkg/clients/client"
)

// result is the class of an API call's outcome.
type result uint8

const (
	resOK        result = iota
	resAPI              // the agent answered with an error
	resTimeout          // the client's deadline passed
	resRefused          // the agent was not listening (nothing was sent)
	resTransport        // the connection failed mid-request
	resMissing          // (history only) the endpoint was not there
)

var resultNames = [...]string{"ok", "api-error", "timeout", "refused", "transport-error", "missing"}

func (r result) String() string { return resultNames[r] }

// classify returns the class of err and a short code for reports:
// "500 internal", "timeout", "refused", "transport".
func classify(err error) (result, string) {
	var ae *client.APIError
	var oe *net.OpError
	switch {
	case err == nil:
		return resOK, ""
	case errors.As(err, &ae):
		return resAPI, strconv.Itoa(ae.Status) + " " + ae.Code
	case errors.Is(err, errReset):
		return resTransport, "reset"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return resTimeout, "timeout"
	case errors.As(err, &oe) && oe.Op == "dial":
		return resRefused, "refused"
	}
	return resTransport, "transport"
}

// ambiguous reports whether a failed call may still have taken effect:
// the agent may have acted on it (a timeout, a broken connection, a 500
// or 504 from actors that stopped or did not answer in time). A refusal
// (4xx, 503 starting or shutting down, nothing listening) did nothing.
func ambiguous(err error) bool {
	var ae *client.APIError
	if errors.As(err, &ae) {
		return ae.Status >= 500 && ae.Status != http.StatusServiceUnavailable
	}
	res, _ := classify(err)
	return res == resTimeout || res == resTransport
}

// isNotFound reports whether err is the agent's 404.
func isNotFound(err error) bool { return client.IsNotFound(err) }

// isCode reports whether err is an agent error with the given code.
func isCode(err error, code string) bool { return client.IsCode(err, code) }
