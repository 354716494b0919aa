package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// maxFlowLine bounds one JSON flow line from an agent.
const maxFlowLine = 1 << 20

// Observe runs `membranectl -o json observe args...` in every agent pod
// (at most a.Parallel at once; with follow all at once, each stream
// bounded by ctx) and calls fn for each flow with its node, serialised:
// without follow after every node answered, sorted by time; with follow
// as each arrives. A node that cannot be read is reported in the
// returned errors (one per node), the others still are.
func (c *Client) Observe(ctx context.Context, a Agents, args []string, follow bool, fn func(models.Flow)) ([]error, error) {
	pods, err := c.AgentPods(ctx, a)
	if err != nil {
		return nil, err
	}
	cmd := append([]string{a.Ctl, "--socket", a.Socket, "-o", "json", "observe"}, args...)
	var mu sync.Mutex
	var all []models.Flow
	emit := func(node string, f models.Flow) {
		if f.Node == "" {
			f.Node = node
		}
		mu.Lock()
		defer mu.Unlock()
		if follow {
			fn(f)
			return
		}
		all = append(all, f)
	}
	errs := make([]error, len(pods))
	par := max(a.Parallel, 1)
	if follow {
		par = len(pods)
	}
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	for i, p := range pods {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			w := &flowLines{emit: func(f models.Flow) { emit(p.Node, f) }}
			err := c.ExecStream(ctx, a.Namespace, p.Name, a.Container, cmd, w)
			if ferr := w.flush(); err == nil {
				err = ferr
			}
			if err != nil && ctx.Err() == nil {
				errs[i] = fmt.Errorf("node %s: %w", p.Node, err)
			}
		}()
	}
	wg.Wait()
	if !follow {
		slices.SortStableFunc(all, func(x, y models.Flow) int { return x.Time.Compare(y.Time) })
		for _, f := range all {
			fn(f)
		}
	}
	var out []error
	for _, e := range errs {
		if e != nil {
			out = append(out, e)
		}
	}
	return out, nil
}

// flowLines decodes the JSON flow lines written to it.
type flowLines struct {
	buf  bytes.Buffer
	emit func(models.Flow)
	err  error
}

func (w *flowLines) Write(p []byte) (int, error) {
	w.buf.Write(p)
	for {
		i := bytes.IndexByte(w.buf.Bytes(), '\n')
		if i < 0 {
			if w.buf.Len() > maxFlowLine {
				return 0, fmt.Errorf("flow line longer than %d bytes", maxFlowLine)
			}
			return len(p), nil
		}
		line := w.buf.Next(i + 1)
		w.decode(line)
	}
}

func (w *flowLines) decode(line []byte) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return
	}
	var f models.Flow
	if err := json.Unmarshal(line, &f); err != nil {
		if w.err == nil {
			w.err = fmt.Errorf("decode flow line %.80q: %w", line, err)
		}
		return
	}
	w.emit(f)
}

// flush decodes a last line without its newline.
func (w *flowLines) flush() error {
	if w.buf.Len() > 0 {
		w.decode(w.buf.Bytes())
		w.buf.Reset()
	}
	return w.err
}

var _ io.Writer = (*flowLines)(nil)
