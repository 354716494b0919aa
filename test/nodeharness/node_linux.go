package nodeharness

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/version"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// Options tunes New. The zero value is an IPv4-less, IPv6-less node in a
// netns of its own named mbt-node-<random>; set at least one range.
type Options struct {
	// Prefix names the node's new netns (Prefix-<random>); default
	// "mbt-node".
	Prefix string
	// NS is a netns of the caller's to use as the node (a node attached
	// to an underlay first); nil: a new one, removed at cleanup.
	NS *testutil.NS
	// NoNetns makes the node the test's own netns: for an agent process
	// on the fake datapath, which needs no root. Pods cannot be added.
	NoNetns bool
	// IPv4Range and IPv6Range are the node's pod ranges ("" leaves the
	// family out).
	IPv4Range, IPv6Range string
	// Dir holds the node's socket, state, delete queue, CNI cache and
	// agent log; default a new tb.TempDir().
	Dir string
	// Network is the CNI network's name; default "membrane-test".
	Network string
	// MTU is the conflist's mtu (0: the plugin's default).
	MTU int
	// AgentTimeout is the conflist's agentTimeout ("": the plugin's
	// default, a minute).
	AgentTimeout string
	// OwnBPFFS mounts a bpffs instance of the node's own at Dir/bpffs,
	// so that no pin of the node meets another's (a machine of its own);
	// false: a fresh directory on the machine's bpffs.
	OwnBPFFS bool
	// Debug logs the in-process agent at debug level (default info).
	Debug bool
	// Log is where the in-process agent logs; nil: Node.Logs, printed
	// when the test fails (a benchmark's many endpoints log elsewhere).
	Log io.Writer
}

// Node is one node: its netns, paths, agent and CNI network.
type Node struct {
	tb testing.TB
	// NS is the node's netns (nil with Options.NoNetns).
	NS *testutil.NS
	// Dir, Socket, StateDir, DeleteQueue and BPFFS are the node's paths
	// (BPFFS is what the agent gets as --bpffs / LinuxConfig.BPFFS).
	Dir, Socket, StateDir, DeleteQueue, BPFFS string
	// IPv4Range and IPv6Range are the pod ranges (invalid: none).
	IPv4Range, IPv6Range netip.Prefix
	// Network is the CNI network's name.
	Network string
	// Conf is the conflist every CNI call uses (Conflist makes others).
	Conf *libcni.NetworkConfigList
	// Logs is the in-process agent's log, printed when the test fails.
	Logs *testutil.LogBuffer
	// Agent is the running in-process agent (nil: none).
	Agent *agent.Agent

	opts Options
	cni  *libcni.CNIConfig
	// discard runs the plugins as cni does with a result cache of its
	// own, which nothing reads (AddRTDiscarded).
	discard *libcni.CNIConfig
	procs   []*Proc
}

// New makes a node for tb; with a netns (the default) it needs root.
// Its cleanup stops the node's agent (pods' DELs, registered later, run
// before), prints the agent's log when tb failed and removes what the
// node made.
func New(tb testing.TB, o Options) *Node {
	tb.Helper()
	if !o.NoNetns {
		testutil.RequireRoot(tb)
	}
	if o.Prefix == "" {
		o.Prefix = "mbt-node"
	}
	if o.Dir == "" {
		o.Dir = tb.TempDir()
	} else if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	if o.Network == "" {
		o.Network = "membrane-test"
	}
	n := &Node{tb: tb, opts: o, Dir: o.Dir, Socket: filepath.Join(o.Dir, "agent.sock"), StateDir: filepath.Join(o.Dir, "state"),
		DeleteQueue: filepath.Join(o.Dir, "delete-queue"), Network: o.Network, Logs: &testutil.LogBuffer{}}
	if o.IPv4Range != "" {
		n.IPv4Range = netip.MustParsePrefix(o.IPv4Range)
	}
	if o.IPv6Range != "" {
		n.IPv6Range = netip.MustParsePrefix(o.IPv6Range)
	}
	switch {
	case o.NoNetns:
		n.BPFFS = filepath.Join(o.Dir, "bpffs") // unused by the fake datapath
	case o.NS != nil:
		n.NS = o.NS
	default:
		n.NS = testutil.NewNS(tb, o.Prefix)
	}
	if !o.NoNetns {
		n.BPFFS = n.bpffs()
	}
	// An explicit exec: libcni makes its default lazily, racing when the
	// first calls are concurrent.
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
	n.cni = libcni.NewCNIConfigWithCacheDir([]string{binDir, RefPluginDir}, filepath.Join(o.Dir, "cni-cache"), exec)
	n.discard = libcni.NewCNIConfigWithCacheDir([]string{binDir, RefPluginDir}, filepath.Join(o.Dir, "cni-cache-discarded"), exec)
	n.Conf = n.Conflist("1.1.0")
	tb.Cleanup(n.cleanup)
	return n
}

// bpffs is the node's pin directory: a bpffs instance of its own or a
// fresh directory on the machine's.
func (n *Node) bpffs() string {
	if !n.opts.OwnBPFFS {
		return testutil.BPFFSDir(n.tb)
	}
	dir := filepath.Join(n.Dir, "bpffs")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		n.tb.Fatal(err)
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, ""); err != nil {
		n.tb.Fatalf("mount bpffs at %s: %v", dir, err)
	}
	n.tb.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			n.tb.Errorf("unmount bpffs %s: %v", dir, err)
		}
	})
	return dir
}

// cleanup stops the agents and removes the health endpoint's netns
// mount, which outlives an agent (restore).
func (n *Node) cleanup() {
	n.StopAgent()
	for _, p := range n.procs {
		p.Stop()
	}
	if n.tb.Failed() {
		if log := n.Logs.String(); log != "" {
			n.tb.Logf("agent log:\n%s", log)
		}
		for _, p := range n.procs {
			n.tb.Logf("%s (tail):\n%s", p.Log, p.Tail(64<<10))
		}
	}
	if n.NS != nil {
		_ = unix.Unmount(filepath.Join(n.StateDir, "health", "netns"), unix.MNT_DETACH) // EINVAL: none
	}
}

// Client returns a client of the node's agent API, closed at cleanup.
func (n *Node) Client() *client.Client {
	c := client.New(n.Socket)
	n.tb.Cleanup(c.Close)
	return c
}

// Do runs fn on a thread in the node's netns (libcni execs the plugin
// there; processes fn starts start there), with a bound of a minute.
func (n *Node) Do(fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if n.NS == nil {
		return fn(ctx)
	}
	return n.NS.Do(func() error { return fn(ctx) })
}

// Conflist is the node's conflist in CNI version v: one membrane-cni
// plugin on the node's socket and delete queue.
func (n *Node) Conflist(v string) *libcni.NetworkConfigList {
	n.tb.Helper()
	mtu := ""
	if n.opts.MTU != 0 {
		mtu = fmt.Sprintf(`,"mtu":%d`, n.opts.MTU)
	}
	if n.opts.AgentTimeout != "" {
		mtu += fmt.Sprintf(`,"agentTimeout":%q`, n.opts.AgentTimeout)
	}
	raw := fmt.Sprintf(`{"cniVersion":%q,"name":%q,"plugins":[{"type":"membrane-cni","socket":%q,"deleteQueueDir":%q%s}]}`,
		v, n.Network, n.Socket, n.DeleteQueue, mtu)
	conf, err := libcni.NetworkConfFromBytes([]byte(raw))
	if err != nil {
		n.tb.Fatalf("conflist: %v", err)
	}
	return conf
}

// RefPluginDir holds the CNI reference plugins (ptp, host-local,
// portmap, bandwidth, tuning: Debian's containernetworking-plugins),
// searched after the plugins Main built, for chained conflists.
const RefPluginDir = "/usr/lib/cni"

// RequirePlugins fails (skips when not root and CI is unset, as every
// root gate) unless each reference plugin of names is installed.
func RequirePlugins(tb testing.TB, names ...string) {
	tb.Helper()
	for _, name := range names {
		if _, err := os.Stat(filepath.Join(RefPluginDir, name)); err == nil {
			continue
		}
		if testutil.InCI() {
			tb.Fatalf("test needs the CNI plugin %s in %s and CI is set: .ci/run installs containernetworking-plugins", name, RefPluginDir)
		}
		tb.Skipf("test needs the CNI plugin %s in %s (containernetworking-plugins)", name, RefPluginDir)
	}
}

// Chain is a conflist of network name in CNI version v: the plugins of
// before (raw JSON objects), membrane-cni on the node's socket and delete
// queue (with membrane's extra keys, raw JSON members, or none), then the
// plugins of after. Debian's reference plugins speak CNI up to 1.0.0.
func (n *Node) Chain(v string, before []string, membrane string, after []string) *libcni.NetworkConfigList {
	n.tb.Helper()
	if membrane != "" {
		membrane = "," + membrane
	}
	if n.opts.MTU != 0 {
		membrane += fmt.Sprintf(`,"mtu":%d`, n.opts.MTU)
	}
	plugins := append(slices.Clone(before), fmt.Sprintf(`{"type":"membrane-cni","socket":%q,"deleteQueueDir":%q%s}`, n.Socket, n.DeleteQueue, membrane))
	plugins = append(plugins, after...)
	raw := fmt.Sprintf(`{"cniVersion":%q,"name":%q,"plugins":[%s]}`, v, n.Network, strings.Join(plugins, ","))
	conf, err := libcni.NetworkConfFromBytes([]byte(raw))
	if err != nil {
		n.tb.Fatalf("conflist %s: %v", raw, err)
	}
	return conf
}

// CNI is the node's libcni, for calls the Pod helpers do not cover.
func (n *Node) CNI() *libcni.CNIConfig { return n.cni }
