package cnibench

import (
	"context"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/version"
)

// timedExec is libcni's default plugin executor (invoke.DefaultExec
// over invoke.RawExec, as libcni builds it when given none) that also
// notes when each plugin process was reaped and its output read, by
// command and container ID: the breakdown splits the time after the
// plugin's last phase into the process's exit (until libcni's exec
// returns) and libcni's own work after it (the result's parsing, the
// cache file).
type timedExec struct {
	invoke.DefaultExec

	mu       sync.Mutex
	returned map[string]time.Time
}

func newTimedExec() *timedExec {
	return &timedExec{
		DefaultExec: invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}},
		returned:    map[string]time.Time{},
	}
}

// ExecPlugin implements invoke.Exec.
func (e *timedExec) ExecPlugin(ctx context.Context, pluginPath string, stdinData []byte, environ []string) ([]byte, error) {
	out, err := e.DefaultExec.ExecPlugin(ctx, pluginPath, stdinData, environ)
	now := time.Now()
	var cmd, id string
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, "CNI_COMMAND="); ok {
			cmd = v
		} else if v, ok := strings.CutPrefix(kv, "CNI_CONTAINERID="); ok {
			id = v
		}
	}
	e.mu.Lock()
	e.returned[cmd+" "+id] = now
	e.mu.Unlock()
	return out, err
}

// returnedAt is when the plugin's exec for cmd and container id returned.
func (e *timedExec) returnedAt(cmd, id string) (time.Time, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	t, ok := e.returned[cmd+" "+id]
	return t, ok
}
