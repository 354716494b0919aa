package agent

import (
	"context"
	"net"
)

// Crash stops the agent abruptly, as close to a SIGKILL as an in-process
// agent allows, for the simulator's crash/restart faults. A new agent is
// then started with Start and the same Config (same socket, same state
// directory, same Fake: kernel state survives a crash).
//
// What it does:
//   - the socket file is left behind, as a killed process leaves it; the
//     next Start removes it as stale (api.Listen);
//   - the API stops accepting connections and closes idle ones at once,
//     without waiting for requests in flight (Stop drains them);
//   - the actors are stopped with Stop, not Poison: messages waiting in
//     mailboxes are dropped, nothing is drained, nothing is released
//     (endpoints, IPs and identities stay for restore);
//   - the CNI delete queue drainer stops; the datapath is not closed (a
//     killed agent closes nothing).
//
// What differs from a real SIGKILL:
//   - actors still run their Stopping/Stopped handling and death-watch:
//     IPAM and identity may see Terminated for endpoint actors and change
//     their in-memory books. That index is discarded, but nothing on these
//     paths may persist state (restore must not write on stop);
//   - requests in flight are not reset: their handlers finish, mostly with
//     errors from the stopped actors (dead letters answer 500 internal),
//     and a request whose answer was already in may still succeed. A
//     killed agent resets the connection. Clients must treat both alike;
//   - answers to stopped actors' requests go to dead letters; their
//     timers (request timeouts, retry, proxy wait) are stopped with them,
//     as an armed timer would keep this Agent reachable;
//   - datapath work already running in a pool worker finishes or sees its
//     context cancelled, so a fake operation without delay may complete
//     just after Crash returns;
//   - goroutines wind down and memory is reclaimed by the GC shortly after
//     Crash returns, not at once.
//
// Crash leaves the Agent stopped; Stop afterwards does nothing (it would
// close the datapath and detach its proxy acknowledgements, which a
// shared Fake now delivers to the agent started next).
func (a *Agent) Crash() {
	a.stopOnce.Do(func() {})
	// A killed agent's watchers die with it: no informer, workqueue
	// worker or identity heartbeat of this incarnation may act on the
	// actors, the API server or the state directory the next one uses.
	// None of these writes anything on the way out.
	if a.k8sSvc != nil {
		a.k8sSvc.Stop()
	}
	if a.k8s != nil {
		a.k8s.Stop()
	}
	if a.stopNodes != nil {
		a.stopNodes()
	}
	if a.stopCNI != nil {
		a.stopCNI()
	}
	if a.stopAddrs != nil {
		a.stopAddrs()
	}
	if a.health != nil {
		a.health.Stop() // a killed agent's responder socket closes
	}
	if a.kvstore != nil {
		a.kvstore.stop() // its etcd connection dies; the lease runs out unless a restart renews it
	}
	if ul, ok := a.lis.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}
	// An already cancelled context: Shutdown closes the listener and the
	// idle connections, then returns without waiting for active ones.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = a.Server.Shutdown(ctx)
	// Serve has returned (its listener is closed); keep its result for a
	// later Stop, which reads it again.
	serr := <-a.served
	a.served <- serr
	a.store.Abort()
	a.System.Stop()
	if a.idBackend != nil {
		_ = a.idBackend.Close() // stops its goroutines; heartbeats end, nothing is released
	}
	a.log.Warn("agent crashed (simulated SIGKILL)", "socket", a.cfg.Socket, "state-dir", a.cfg.StateDir)
}
