package nodeharness

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
)

// AgentConfig is the in-process agent's configuration on the node: the
// Linux datapath in the node's netns on its pins, its socket, state and
// delete queue (drained at start only), no teardown delay and no
// periodic garbage collection.
func (n *Node) AgentConfig() agent.Config {
	return agent.Config{
		Socket: n.Socket, StateDir: n.StateDir, IPv4Range: n.IPv4Range, IPv6Range: n.IPv6Range, Datapath: "linux",
		Linux:          datapath.LinuxConfig{HostNetns: n.NS.Path, BPFFS: n.BPFFS, TeardownDelay: -1},
		DeleteQueueDir: n.DeleteQueue, DeleteQueueInterval: time.Hour, GCInterval: time.Hour,
	}
}

// StartAgent starts an agent in the test's process on AgentConfig, which
// mod (if not nil) may change first; it logs to n.Logs. A node's state
// and pins outlive StopAgent, so a second StartAgent restores them.
func (n *Node) StartAgent(mod func(*agent.Config)) *agent.Agent {
	n.tb.Helper()
	cfg := n.AgentConfig()
	if mod != nil {
		mod(&cfg)
	}
	level := slog.LevelInfo
	if n.opts.Debug {
		level = slog.LevelDebug
	}
	var out io.Writer = n.Logs
	if n.opts.Log != nil {
		out = n.opts.Log
	}
	a, err := agent.Start(cfg, slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: level})))
	if err != nil {
		n.tb.Fatalf("start agent: %v", err)
	}
	n.Agent = a
	return a
}

// StopAgent stops the in-process agent gracefully (endpoints stay in the
// kernel and on disk for a restart); without one it does nothing.
func (n *Node) StopAgent() {
	if n.Agent == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.Agent.Stop(ctx); err != nil {
		n.tb.Errorf("stop agent: %v", err)
	}
	n.Agent = nil
}

// Linux is the running in-process agent's Linux datapath.
func (n *Node) Linux() *datapath.Linux {
	n.tb.Helper()
	if n.Agent == nil {
		n.tb.Fatal("no agent running")
	}
	l, ok := n.Agent.System.Datapath.(*datapath.Linux)
	if !ok {
		n.tb.Fatalf("the agent's datapath is %T, not the Linux one", n.Agent.System.Datapath)
	}
	return l
}
