package cni

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/membrane-cni/membrane/pkg/clients/cni/skel"

	"github.com/membrane-cni/membrane/pkg/domain/ifname"
)

// Timeouts of one CNI call. kubelet's own deadline is minutes; these keep
// a hung agent from holding the runtime much longer than an ADD takes.
const (
	// DefaultAgentTimeout is a call's wait for the agent unless the
	// config's agentTimeout says otherwise (NetConf.AgentTimeout).
	DefaultAgentTimeout = 60 * time.Second
	rollbackTimeout     = 15 * time.Second
	// startingWait is how long a call waits for an agent that answers
	// "starting" (restoring, draining the delete queue) before giving up.
	startingWait = 5 * time.Second
)

// Funcs returns the CNI command handlers for skel.PluginMainFuncs.
func Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck, Status: cmdStatus, GC: cmdGC}
}

// VersionInfo is the versions skel negotiates with the runtime.
func VersionInfo() version.PluginInfo { return version.PluginSupports(SupportedVersions...) }

// About is printed when the binary runs without CNI_COMMAND.
const About = "membrane-cni: the Membrane CNI plugin (talks to membrane-agent)"

// call holds what every command parses first.
type call struct {
	args   *skel.CmdArgs
	conf   *NetConf
	k8s    Args
	client *agentClient
}

func newCall(args *skel.CmdArgs) (*call, error) {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return nil, err
	}
	k8s, err := ParseArgs(args.Args)
	if err != nil {
		return nil, err
	}
	return &call{args: args, conf: conf, k8s: k8s, client: &agentClient{socket: conf.Socket}}, nil
}

// checkIfName validates CNI_IFNAME before it names a link (ADD, CHECK).
// Returns CNI error 4 naming the variable.
func checkIfName(name string) error {
	if !ifname.Valid(name) {
		return envError("CNI_IFNAME", "%q: want an interface name of 1..%d bytes without '/', ':', '%%' or spaces, other than ., .., all and default", name, ifname.MaxLen)
	}
	return nil
}

// newDelCall is newCall for DEL, which must not wedge a pod (a runtime
// retries a failing DEL forever): a config or CNI_ARGS detail the plugin
// dislikes is reported on stderr and DEL goes on with what parsed and
// the defaults for the rest. Only the socket and the delete queue matter
// to DEL; CNI_ARGS only label a queued deletion.
func newDelCall(args *skel.CmdArgs) *call {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		warnf("DEL %s: %v; going on with defaults", args.ContainerID, err)
		conf = lenientConfig(args.StdinData)
	}
	k8s, err := ParseArgs(args.Args)
	if err != nil {
		warnf("DEL %s: %v; ignored", args.ContainerID, err)
		k8s = Args{}
	}
	return &call{args: args, conf: conf, k8s: k8s, client: &agentClient{socket: conf.Socket}}
}

// stderr receives the plugin's warnings (runtimes log a plugin's stderr).
var stderr io.Writer = os.Stderr

func warnf(format string, args ...any) {
	fmt.Fprintf(stderr, "membrane-cni: "+format+"\n", args...)
}

// unreachable reports whether err means the agent is not there to ask:
// the socket is missing or refuses, or the agent is shutting down.
func unreachable(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var ae *apiError
	return errors.As(err, &ae) && ae.Status == 503
}

// retryStarting runs fn again while the agent answers 503 "starting",
// for at most startingWait.
func retryStarting(ctx context.Context, fn func() error) error {
	deadline := time.Now().Add(startingWait)
	for {
		err := fn()
		if !isCode(err, "starting") || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(retryDelay):
		}
	}
}

// agentError turns an API error into a CNI error with Membrane's codes.
func agentError(op string, err error) *types.Error {
	var te *types.Error
	switch {
	case errors.As(err, &te):
		return te
	case isCode(err, "ipam-exhausted"):
		return newError(CodeIPAMExhausted, "%s: no free address in the agent's pool: %v", op, err)
	case isCode(err, "netns-unavailable"):
		return newError(CodeNetns, "%s: %v", op, err)
	case isCode(err, "interface-exists"):
		return newError(CodeInterfaceExists, "%s: %v", op, err)
	case isCode(err, "kernel-error"):
		return newError(CodeKernel, "%s: %v", op, err)
	case isCode(err, "state-disk-full"):
		return newError(CodeStateDisk, "%s: the agent's state directory is full (ENOSPC), nothing was attached: %v", op, err)
	case isCode(err, "state-dir-read-only"):
		return newError(CodeStateDisk, "%s: the agent's state directory is read-only (EROFS), nothing was attached: %v", op, err)
	case isCode(err, "state-disk-io-error"):
		return newError(CodeStateDisk, "%s: the agent's state directory fails I/O (EIO), nothing was attached: %v", op, err)
	case unreachable(err):
		return newError(CodeAgentUnreachable, "%s: agent unreachable: %v", op, err)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return newError(CodeAgentUnreachable, "%s: agent unreachable: no answer within the call's timeout (agentTimeout; the agent is stalled or overloaded): %v", op, err)
	}
	return newError(CodeAgentError, "%s: %v", op, err)
}

func kernelError(op string, err error) *types.Error {
	var te *types.Error
	if errors.As(err, &te) {
		return te
	}
	return newError(CodeKernel, "%s: %v", op, err)
}
