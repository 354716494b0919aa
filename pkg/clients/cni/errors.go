package cni

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
)

// Membrane's own CNI error codes (the spec reserves 100 and up for
// plugins). The spec's codes used here: 1 incompatible version, 4 bad
// environment variable, 6 undecodable config, 7 invalid config, 11 try
// again later, 50 plugin not available (STATUS).
const (
	// CodeAgentUnreachable: the agent did not answer on its socket (ADD,
	// CHECK, GC; DEL queues the deletion instead).
	CodeAgentUnreachable uint = 100
	// CodeAgentError: the agent refused or failed the request; the message
	// carries the agent's error code.
	CodeAgentError uint = 101
	// CodeIPAMExhausted: the agent's pool has no free address.
	CodeIPAMExhausted uint = 102
	// CodeNetns: CNI_NETNS cannot be opened.
	CodeNetns uint = 103
	// CodeInterfaceExists: CNI_IFNAME already exists in the pod's netns.
	CodeInterfaceExists uint = 104
	// CodeKernel: a netlink operation (veth, address, route) failed.
	CodeKernel uint = 105
	// CodeCheckFailed: CHECK found the attachment differs from prevResult
	// or the endpoint is not ready.
	CodeCheckFailed uint = 106
	// CodeDeleteQueue: the delete queue could not be written.
	CodeDeleteQueue uint = 107
	// CodeStateDisk: the agent cannot make the endpoint's state durable
	// (its state directory is full, read-only or failing I/O), so it
	// refused the attachment; the message names which.
	CodeStateDisk uint = 108
)

func newError(code uint, format string, args ...any) *types.Error {
	return types.NewError(code, fmt.Sprintf(format, args...), "")
}

// envError is code 4, naming the variable.
func envError(name, format string, args ...any) *types.Error {
	return types.NewError(types.ErrInvalidEnvironmentVariables, name+": "+fmt.Sprintf(format, args...), "")
}

// configError is code 7, naming the key.
func configError(key, format string, args ...any) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("network config key %q: ", key)+fmt.Sprintf(format, args...), "")
}
