package k8s

import (
	"context"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Connection states of models.K8sStatus.Connection.
const (
	connConnecting   = "connecting"
	connConnected    = "connected"
	connDisconnected = "disconnected"
)

// conn is the API server connection as the agent last saw it; guarded by
// Watcher.mu.
type conn struct {
	state       string
	lastError   string
	lastErrorAt time.Time
	lastContact time.Time
	// disconnects counts transitions to disconnected.
	disconnects int
}

// probe asks the API server's /readyz every interval until ctx ends:
// an answer marks the connection connected, an error disconnected. The
// informers reconnect on their own (client-go's reflector backs off and
// resumes its watch); the probe only reports.
func (w *Watcher) probe(ctx context.Context, client kubernetes.Interface, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, min(interval, 5*time.Second))
		_, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		w.observe(err)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// observe records a probe's outcome.
func (w *Watcher) observe(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	if err == nil {
		if w.conn.state != connConnected {
			w.log.Info("k8s API server reachable", "was", w.conn.state)
		}
		w.conn.state, w.conn.lastContact = connConnected, now
		return
	}
	if w.conn.state != connDisconnected {
		w.conn.disconnects++
		w.log.Warn("k8s API server unreachable; running endpoints keep working, CNI ADDs use the cached pods", "err", err)
	}
	w.conn.state, w.conn.lastError, w.conn.lastErrorAt = connDisconnected, err.Error(), now
}

// watchError is the informers' watch error handler: it records the error
// (the probe decides the connection state).
func (w *Watcher) watchError(resource string) cache.WatchErrorHandlerWithContext {
	return func(_ context.Context, _ *cache.Reflector, err error) {
		w.mu.Lock()
		w.conn.lastError, w.conn.lastErrorAt = resource+": "+err.Error(), time.Now()
		w.mu.Unlock()
		w.log.Debug("k8s watch error", "resource", resource, "err", err)
	}
}
