package kvstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// reconnectMax bounds the wait between attempts to reconnect to etcd.
const reconnectMax = time.Second

// Client is this node's connection to etcd and its lease. Keys that live
// as long as the node does (identity references, the node entry, its
// endpoints) are written under the lease; when the lease is lost (etcd
// expired it while the node could not renew it) the Client grants a new
// one and calls every OnLease callback, which writes those keys again.
type Client struct {
	cfg  Config
	keys keys
	log  *slog.Logger
	cli  *clientv3.Client
	ctx  context.Context
	stop context.CancelFunc
	done chan struct{}
	// closeOnce makes Close idempotent; closeErr is its result.
	closeOnce sync.Once
	closeErr  error

	// mu guards everything below.
	mu       sync.Mutex
	lease    clientv3.LeaseID // 0: none granted yet
	onLease  []func(lease clientv3.LeaseID)
	healthy  bool
	lastErr  string
	since    time.Time
	regrants int  // leases granted after the first
	granted  bool // a lease was ever granted
	// kept counts the leases kept after their keep-alive lapsed (etcd
	// still held them: stillHeld).
	kept int
	// lapse makes the keep-alive lapse as if its answers stopped (only
	// tests send: LapseKeepAlive).
	lapse chan struct{}
	// resumed is closed (and replaced) when etcd is reachable and a lease
	// is held again after either was not (interrupted).
	resumed     chan struct{}
	interrupted bool
	// reachable is closed (and replaced) whenever etcd becomes reachable
	// (the lease loop then grants at once).
	reachable chan struct{}
}

// Health is the connection's state for /v1/status.
type Health struct {
	Healthy   bool
	LastError string
	Since     time.Time
	Lease     int64
	Regrants  int
	// Kept counts the times the lease's keep-alive lapsed while etcd still
	// held it: the node kept it, and its keys, rather than a new one.
	Kept int
}

// Connect validates cfg, dials etcd and starts keeping a node lease alive
// in the background. It does not wait for etcd: while etcd cannot be
// reached the Client reports itself unhealthy and operations needing the
// lease return ErrUnavailable.
func Connect(cfg Config, log *slog.Logger) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	tlsCfg, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: cfg.Endpoints, DialTimeout: cfg.DialTimeout, TLS: tlsCfg,
		DialKeepAliveTime: 5 * time.Second, DialKeepAliveTimeout: 5 * time.Second,
		// gRPC's default reconnect backoff grows to 2 minutes: after an
		// outage of a few seconds etcd would be back long before the
		// client tried again. At most 1 s between attempts.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: reconnectMax},
			MinConnectTimeout: cfg.DialTimeout,
		})},
		Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("connect to etcd %v: %w", cfg.Endpoints, err)
	}
	ctx, stop := context.WithCancel(context.Background())
	c := &Client{cfg: cfg, keys: keys{cfg.Prefix}, log: log.With("subsys", "kvstore"), cli: cli,
		ctx: ctx, stop: stop, done: make(chan struct{}), since: time.Now(), resumed: make(chan struct{}), reachable: make(chan struct{}),
		lapse: make(chan struct{}, 1)}
	go c.leaseLoop()
	return c, nil
}

// Etcd is the underlying client (tests and the numbers use it).
func (c *Client) Etcd() *clientv3.Client { return c.cli }

// NodeName is this node's name.
func (c *Client) NodeName() string { return c.cfg.NodeName }

// Lease returns the current node lease; ok is false until one is granted.
func (c *Client) Lease() (id clientv3.LeaseID, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lease, c.lease != 0
}

// awaitLease waits (bounded by ctx and the request timeout) until the
// node holds a lease other than old; false when it does not in time.
func (c *Client) awaitLease(ctx context.Context, old clientv3.LeaseID) bool {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	for {
		if l, ok := c.Lease(); ok && l != old {
			return true
		}
		if !sleep(ctx, 10*time.Millisecond) {
			return false
		}
	}
}

// OnLease registers fn, called on the lease goroutine with every lease
// granted from now on, and at once with the current one if there is one.
// fn must not block: it tells its owner's goroutine to write its keys
// again under the new lease.
func (c *Client) OnLease(fn func(lease clientv3.LeaseID)) {
	c.mu.Lock()
	c.onLease = append(c.onLease, fn)
	lease := c.lease
	c.mu.Unlock()
	if lease != 0 {
		fn(lease)
	}
}

// Health returns the connection's state.
func (c *Client) Health() Health {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Health{Healthy: c.healthy, LastError: c.lastErr, Since: c.since, Lease: int64(c.lease), Regrants: c.regrants, Kept: c.kept}
}

// observe records the outcome of a call to etcd: any success makes the
// store healthy, a failure other than the caller's own cancellation
// unhealthy.
func (c *Client) observe(err error) {
	if err != nil && (errors.Is(err, context.Canceled) && c.ctx.Err() != nil) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	healthy := err == nil
	if err != nil {
		c.lastErr = err.Error()
	}
	if healthy != c.healthy {
		c.healthy, c.since = healthy, time.Now()
		if healthy {
			c.log.Info("etcd reachable")
			close(c.reachable)
			c.reachable = make(chan struct{})
			c.maybeResumedLocked()
		} else {
			c.interrupted = true
			c.log.Warn("etcd unreachable", "err", err)
		}
	}
}

// maybeResumedLocked closes resumed if etcd is reachable and a lease is
// held after an interruption: what waited for the store (an identity
// Acquire needs both) may go on at once.
func (c *Client) maybeResumedLocked() {
	if c.interrupted && c.healthy && c.lease != 0 {
		c.interrupted = false
		close(c.resumed)
		c.resumed = make(chan struct{})
	}
}

// Resumed returns a channel closed the next time etcd is reachable and
// the node holds a lease after a failed call or a lost lease.
func (c *Client) Resumed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.resumed
}

// observeConflict records a problem that is not etcd's health.
func (c *Client) observeConflict(msg string) {
	c.mu.Lock()
	c.lastErr = msg
	c.mu.Unlock()
}

// call runs fn with the request timeout and records its outcome; an error
// wraps ErrUnavailable.
func (c *Client) call(ctx context.Context, what string, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	err := fn(ctx)
	c.observe(err)
	if err != nil {
		return fmt.Errorf("%s: %w: %w", what, ErrUnavailable, err)
	}
	return nil
}

// leaseLoop grants the node lease, keeps it alive, grants a new one when
// it is lost, and probes etcd's health between keep-alives.
func (c *Client) leaseLoop() {
	defer close(c.done)
	backoff := 100 * time.Millisecond
	var lapsed clientv3.LeaseID // the lease whose keep-alive just lapsed
	for c.ctx.Err() == nil {
		if lapsed != 0 && c.stillHeld(lapsed) {
			lapsed = c.keepAlive(lapsed, true)
			continue
		}
		c.mu.Lock()
		reachable := c.reachable
		c.mu.Unlock()
		var grant *clientv3.LeaseGrantResponse
		err := c.call(c.ctx, "grant node lease", func(ctx context.Context) (err error) {
			grant, err = c.cli.Grant(ctx, int64(c.cfg.LeaseTTL/time.Second))
			return err
		})
		if err != nil {
			c.log.Debug("granting the node lease", "err", err)
			if !sleepOr(c.ctx, backoff, reachable, nil) { // another call reaching etcd ends the wait
				return
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		lapsed = c.keepAlive(grant.ID, false)
	}
}

// stillHeld reports whether etcd still holds lease, whose keep-alive
// lapsed: the client gave up waiting for a renewal's answer (a node
// starved of CPU reads it late), while etcd had renewed the lease on the
// request. The node's keys are then all there under it.
func (c *Client) stillHeld(lease clientv3.LeaseID) bool {
	var ttl *clientv3.LeaseTimeToLiveResponse
	err := c.call(c.ctx, "check the node lease", func(ctx context.Context) (err error) {
		ttl, err = c.cli.TimeToLive(ctx, lease)
		return err
	})
	return err == nil && ttl.TTL > 0
}

// keepAlive installs lease as the node lease and renews it until it is
// lost (it returns lease) or the Client closes (0). A new lease (kept
// false) runs the OnLease callbacks, which write the node's keys again;
// one kept after its keep-alive lapsed (kept) does not: etcd never
// dropped it, nor the keys under it, and writing them again would cost
// every other node their events for nothing.
func (c *Client) keepAlive(lease clientv3.LeaseID, kept bool) clientv3.LeaseID {
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	ch, err := c.cli.KeepAlive(ctx, lease)
	if err != nil {
		c.observe(err)
		return 0
	}
	c.mu.Lock()
	if c.granted && !kept {
		c.regrants++
	}
	if kept {
		c.kept++
	}
	c.lease, c.granted = lease, true
	c.maybeResumedLocked()
	fns := append([]func(clientv3.LeaseID){}, c.onLease...)
	c.mu.Unlock()
	if kept {
		c.log.Info("node lease kept: its keep-alive lapsed, etcd still held it", "lease", fmt.Sprintf("%x", int64(lease)))
	} else {
		c.log.Info("node lease granted", "lease", fmt.Sprintf("%x", int64(lease)), "ttl", c.cfg.LeaseTTL)
		for _, fn := range fns {
			fn(lease)
		}
	}
	probe := time.NewTicker(max(c.cfg.LeaseTTL/5, time.Second))
	defer probe.Stop()
	for {
		ok := true
		select {
		case _, ok = <-ch:
		case <-c.lapse:
			ok = false
		case <-probe.C:
			_ = c.call(ctx, "probe etcd", func(ctx context.Context) error {
				_, err := c.cli.Get(ctx, c.keys.prefix+"health", clientv3.WithCountOnly())
				return err
			})
		case <-ctx.Done():
			return 0
		}
		if ok {
			continue
		}
		if c.ctx.Err() != nil {
			return 0
		}
		c.log.Warn("node lease keep-alive lapsed; granting a new lease unless etcd still holds this one", "lease", fmt.Sprintf("%x", int64(lease)))
		c.mu.Lock()
		c.lease = 0 // writes wait for the next one
		c.interrupted = true
		c.mu.Unlock()
		return lease
	}
}

// Close revokes nothing (the lease expires on its own, so a restarted
// agent's keys stay meanwhile), stops the lease loop and closes the
// connection. Idempotent.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.stop()
		<-c.done
		c.closeErr = c.cli.Close()
	})
	return c.closeErr
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// sleepOr is sleep that also ends early (true) when wake or kick fires
// (a nil channel never does): a retry need not sit out its backoff once
// etcd is back or a new lease was granted.
func sleepOr(ctx context.Context, d time.Duration, wake <-chan struct{}, kick <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-wake:
	case <-kick:
	case <-ctx.Done():
		return false
	}
	return true
}

// Endpoints are etcd's client URLs.
func (c *Client) Endpoints() []string { return append([]string(nil), c.cfg.Endpoints...) }
