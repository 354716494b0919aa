// Package nodesfile feeds the agent the remote nodes listed in a static
// file (standalone mode, --nodes-file): a JSON or YAML list of
//
//   - name: node-b
//     addresses: [192.168.50.2, "fd50::2"]
//     podCIDRs: [10.1.0.0/24, "fd01::/64"]
//
// The file is polled and re-read when its content changes; each valid
// content is the full set of source "file" (actors.System.SyncNodes). The
// entry whose pod CIDRs overlap this agent's own pod ranges is this node
// and is skipped, so every node can read one shared file.
package nodesfile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/membrane-cni/membrane/datapath"
)

// Source is the SyncNodes source name of the file's nodes.
const Source = "file"

// maxFileSize bounds the file read.
const maxFileSize = 4 << 20

// ErrInvalidFile is wrapped by Parse's errors.
var ErrInvalidFile = errors.New("invalid nodes file")

type entry struct {
	Name      string   `json:"name"`
	Addresses []string `json:"addresses"`
	PodCIDRs  []string `json:"podCIDRs"`
}

// Parse decodes a nodes file (JSON or YAML; unknown fields refused) and
// validates the set (datapath.ValidateNodes).
func Parse(data []byte) ([]datapath.RemoteNode, error) {
	var es []entry
	if err := yaml.UnmarshalStrict(data, &es); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidFile, err)
	}
	out := make([]datapath.RemoteNode, 0, len(es))
	for i, e := range es {
		n := datapath.RemoteNode{Name: e.Name}
		for _, s := range e.Addresses {
			a, err := netip.ParseAddr(s)
			if err != nil {
				return nil, fmt.Errorf("%w: node %d (%q): address %q: %w", ErrInvalidFile, i, e.Name, s, err)
			}
			n.Addrs = append(n.Addrs, a)
		}
		for _, s := range e.PodCIDRs {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return nil, fmt.Errorf("%w: node %d (%q): pod CIDR %q: %w", ErrInvalidFile, i, e.Name, s, err)
			}
			n.PodCIDRs = append(n.PodCIDRs, p)
		}
		out = append(out, n)
	}
	if err := datapath.ValidateNodes(out); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidFile, err)
	}
	return out, nil
}

// Sink takes the file's full set (actors.System satisfies it).
type Sink interface {
	SyncNodes(ctx context.Context, source string, nodes []datapath.RemoteNode) error
}

// Watcher polls one nodes file.
type Watcher struct {
	Path     string
	Interval time.Duration  // default 1 s
	Local    []netip.Prefix // this node's pod ranges: its own entry is skipped
	Sink     Sink
	Log      *slog.Logger
}

// Run polls until ctx ends. A missing, unreadable or invalid file is
// logged and keeps the last set; a failed sync is retried next tick.
func (w *Watcher) Run(ctx context.Context) {
	interval := w.Interval
	if interval <= 0 {
		interval = time.Second
	}
	var last []byte
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if data, changed := w.read(last); changed {
			if w.apply(ctx, data) {
				last = data
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// read returns the file's content and whether it differs from last.
func (w *Watcher) read(last []byte) ([]byte, bool) {
	f, err := os.Open(w.Path)
	if err != nil {
		w.Log.Warn("nodes file unreadable; keeping the last set", "path", w.Path, "err", err)
		return nil, false
	}
	defer f.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(f, maxFileSize+1)); err != nil {
		w.Log.Warn("nodes file unreadable; keeping the last set", "path", w.Path, "err", err)
		return nil, false
	}
	data := buf.Bytes()
	return data, last == nil || !bytes.Equal(data, last)
}

// apply parses data and hands the set to the sink; false: retry later.
func (w *Watcher) apply(ctx context.Context, data []byte) bool {
	if len(data) > maxFileSize {
		w.Log.Error("nodes file too large; keeping the last set", "path", w.Path, "max-bytes", maxFileSize)
		return true // not retried until it changes
	}
	nodes, err := Parse(data)
	if err != nil {
		w.Log.Error("nodes file invalid; keeping the last set", "path", w.Path, "err", err)
		return true
	}
	nodes = w.withoutSelf(nodes)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := w.Sink.SyncNodes(sctx, Source, nodes); err != nil {
		w.Log.Error("nodes file: sync failed; retrying", "path", w.Path, "err", err)
		return false
	}
	w.Log.Info("nodes file applied", "path", w.Path, "nodes", len(nodes))
	return true
}

func (w *Watcher) withoutSelf(nodes []datapath.RemoteNode) []datapath.RemoteNode {
	out := nodes[:0:0]
	for _, n := range nodes {
		if _, _, self := datapath.PodCIDROverlap([]datapath.RemoteNode{n}, w.Local); self {
			continue
		}
		out = append(out, n)
	}
	return out
}
