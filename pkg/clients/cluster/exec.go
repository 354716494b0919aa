package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
)

// maxExecOutput bounds what one exec may write to its stdout or stderr
// buffer: an agent's JSON answers are far smaller; a runaway command
// must not grow membranectl without bound.
const maxExecOutput = 32 << 20

// Client reaches pods through the API server.
type Client struct {
	Config *rest.Config
	Kube   kubernetes.Interface
}

// NewClient builds a Client from a rest.Config.
func NewClient(cfg *rest.Config) (*Client, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return &Client{Config: cfg, Kube: cs}, nil
}

// ExecError is a command that ran in the pod and exited non-zero (or
// could not start there).
type ExecError struct {
	Pod    string
	Cmd    []string
	Err    error
	Stderr string
}

func (e *ExecError) Error() string {
	msg := fmt.Sprintf("exec %q in %s: %v", strings.Join(e.Cmd, " "), e.Pod, e.Err)
	if s := strings.TrimSpace(e.Stderr); s != "" {
		msg += ": " + s
	}
	return msg
}

func (e *ExecError) Unwrap() error { return e.Err }

// Exec runs cmd in a container of a pod and returns its stdout. A
// non-zero exit is an *ExecError carrying stderr. It uses the websocket
// protocol and falls back to SPDY for API servers that do not offer it,
// as kubectl does.
func (c *Client) Exec(ctx context.Context, ns, pod, container string, cmd []string) ([]byte, error) {
	stdout := &limitedBuffer{max: maxExecOutput}
	err := c.ExecStream(ctx, ns, pod, container, cmd, stdout)
	if err == nil && stdout.over {
		err = &ExecError{Pod: ns + "/" + pod, Cmd: cmd, Err: fmt.Errorf("output longer than %d bytes", maxExecOutput)}
	}
	return stdout.Bytes(), err
}

// ExecStream is Exec writing the command's stdout to stdout as it comes
// (a follow stream), for as long as it runs or ctx lasts.
func (c *Client) ExecStream(ctx context.Context, ns, pod, container string, cmd []string, stdout io.Writer) error {
	req := c.Kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(c.Config, "GET", req.URL().String())
	if err != nil {
		return fmt.Errorf("exec in %s/%s: %w", ns, pod, err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(c.Config, "POST", req.URL())
	if err != nil {
		return fmt.Errorf("exec in %s/%s: %w", ns, pod, err)
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return fmt.Errorf("exec in %s/%s: %w", ns, pod, err)
	}
	stderr := &limitedBuffer{max: 64 << 10}
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: stdout, Stderr: stderr}); err != nil {
		return &ExecError{Pod: ns + "/" + pod, Cmd: cmd, Err: err, Stderr: stderr.String()}
	}
	return nil
}

// ExitCode is the command's exit status when err says it exited
// non-zero, else -1.
func ExitCode(err error) int {
	var ee interface{ ExitStatus() int }
	if errors.As(err, &ee) {
		return ee.ExitStatus()
	}
	return -1
}

// limitedBuffer keeps at most max bytes and remembers it dropped some.
type limitedBuffer struct {
	bytes.Buffer
	max  int
	over bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); len(p) > room {
		b.over = true
		if room > 0 {
			b.Buffer.Write(p[:room])
		}
		return len(p), nil
	}
	return b.Buffer.Write(p)
}

var _ io.Writer = (*limitedBuffer)(nil)
