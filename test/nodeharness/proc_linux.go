package nodeharness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// Proc is a membrane-agent process on a node, started, killed and
// restarted by the test on the node's socket, state, delete queue and
// pins. Main must have built membrane-agent.
type Proc struct {
	n *Node
	// Args are the agent's flags: the node's (ProcArgs) and the extra
	// ones given to Process; a test may append more before a Start.
	Args []string
	// Wrap is a command the agent runs under (its path and Args follow),
	// or none.
	Wrap []string
	// Log is the agent's stdout and stderr, appended across restarts.
	Log string
	// Path is the membrane-agent binary to run ("": the one Main built),
	// e.g. an older build for an A/B.
	Path string

	cmd    *exec.Cmd
	exited <-chan struct{}
	starts int
}

// ProcArgs are a process's flags for the node: its socket, state, delete
// queue, pins and ranges, debug logs, and on a node with a netns the
// Linux datapath (a later --datapath overrides it).
func (n *Node) ProcArgs() []string {
	args := []string{"--socket", n.Socket, "--state-dir", n.StateDir, "--delete-queue-dir", n.DeleteQueue, "--bpffs", n.BPFFS,
		"--log-level", "debug"}
	if n.IPv4Range.IsValid() {
		args = append(args, "--ipv4-range", n.IPv4Range.String())
	}
	if n.IPv6Range.IsValid() {
		args = append(args, "--ipv6-range", n.IPv6Range.String())
	}
	if n.NS != nil {
		args = append(args, "--datapath", "linux")
	}
	return args
}

// Process prepares (does not start) the node's agent process with
// ProcArgs and extra flags; the node's cleanup stops it and prints its
// log's tail when the test failed.
func (n *Node) Process(extra ...string) *Proc {
	p := &Proc{n: n, Args: append(n.ProcArgs(), extra...), Log: filepath.Join(n.Dir, "agent.log")}
	n.procs = append(n.procs, p)
	return p
}

// Command is the process's command line (Wrap, the binary, Args), not
// started, with stdout and stderr unset.
func (p *Proc) Command() *exec.Cmd {
	bin := p.Path
	if bin == "" {
		bin = Bin("membrane-agent")
	}
	argv := append(append(append([]string{}, p.Wrap...), bin), p.Args...)
	return exec.Command(argv[0], argv[1:]...)
}

// Start starts the process in the node's netns and waits until the agent
// is ready (restore done, the delete queue drained); it fails the test
// otherwise.
func (p *Proc) Start() {
	p.n.tb.Helper()
	if err := p.StartErr(); err != nil {
		p.n.tb.Fatal(err)
	}
}

// StartErr is Start returning the error (for starting several nodes at
// once from goroutines).
func (p *Proc) StartErr() error {
	f, err := os.OpenFile(p.Log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	p.starts++
	fmt.Fprintf(f, "\n===== start %d =====\n", p.starts)
	cmd := p.Command()
	cmd.Stdout, cmd.Stderr = f, f
	// It dies with the thread that started it if the test binary dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var exited <-chan struct{}
	if p.n.NS != nil {
		exited, err = p.n.NS.StartPinned(cmd)
	} else {
		exited, err = testutil.StartPinned(cmd)
	}
	f.Close()
	if err != nil {
		return fmt.Errorf("start agent: %w", err)
	}
	p.cmd, p.exited = cmd, exited
	c := client.New(p.n.Socket)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.WaitReady(ctx, exited); err != nil {
		return fmt.Errorf("start agent (%v): %w\n%s", cmd.ProcessState, err, p.Tail(32<<10))
	}
	return nil
}

// Kill sends SIGKILL (a crash: nothing is cleaned up) and waits until
// the process is gone.
func (p *Proc) Kill() {
	if p.cmd == nil {
		return
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		p.n.tb.Fatalf("kill agent: %v", err)
	}
	<-p.exited
	p.cmd = nil
}

// Stop sends SIGTERM and waits (SIGKILL after 30 s).
func (p *Proc) Stop() {
	if p.cmd == nil {
		return
	}
	testutil.Stop(p.cmd.Process, p.exited, 30*time.Second)
	p.cmd = nil
}

// Running reports whether the process was started and not stopped or
// killed by the test.
func (p *Proc) Running() bool { return p.cmd != nil }

// Exited closes when the running process exits.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Pid is the running process's ID.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Tail is the last max bytes of the process's log.
func (p *Proc) Tail(max int) string {
	data, _ := os.ReadFile(p.Log)
	if len(data) > max {
		data = data[len(data)-max:]
	}
	return string(data)
}
