// Package cnidrain is the agent's half of the CNI plugin's contracts:
// it drains the delete queue membrane-cni writes while the agent is
// unreachable. (Endpoints whose host interface vanished are deleted by
// the garbage collector actor, actors/gc.go.) It talks to the actor system directly
// because it runs before the API accepts mutating calls. Kernel work goes
// through the datapath worker pool.
package cnidrain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/pkg/clients/cni/delqueue"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// opTimeout bounds the handling of one queued deletion or lost endpoint.
const opTimeout = 30 * time.Second

// Lock takes the attachment (container ID, interface) from the attaches
// and deletes in flight through the API, and returns its release; it
// fails when ctx ends first (the entry then waits for the next drain).
type Lock func(ctx context.Context, containerID, ifName string) (release func(), err error)

// Drain handles every queued deletion in dir: the attachment's endpoint
// (container ID and interface) is deleted (releasing its addresses and tearing its host veth down); if
// the agent has no such endpoint, the entry's addresses are released when
// they are still allocated to the entry's pod and bound to no endpoint,
// and the host veth is torn down. Handled entries are removed; entries
// that fail stay for the next drain, undecodable ones are removed with a
// warning. Each is handled holding its attachment (lock; nil: no attach
// can be in flight), so a queued DEL of an ADD still in flight waits for
// it rather than leave what it makes behind. Returns how many entries
// were handled.
func Drain(ctx context.Context, sys *actors.System, dir string, lock Lock, log *slog.Logger) (int, error) {
	paths, err := delqueue.List(dir)
	if err != nil || len(paths) == 0 {
		return 0, err
	}
	log = log.With("component", "delete-queue")
	done := 0
	var firstErr error
	for _, path := range paths {
		e, err := delqueue.Read(path)
		if errors.Is(err, delqueue.ErrInvalidEntry) {
			log.Warn("dropping undecodable delete queue entry", "path", path, "err", err)
			_ = delqueue.Remove(path)
			continue
		}
		if err == nil {
			err = handle(ctx, sys, e, lock)
		}
		if err != nil {
			log.Warn("queued deletion failed; kept for the next drain", "path", path, "err", err)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if err := delqueue.Remove(path); err != nil && firstErr == nil {
			firstErr = err
		}
		log.Info("queued deletion done", "container", e.ContainerID, "queued", e.Queued)
		done++
	}
	return done, firstErr
}

func handle(ctx context.Context, sys *actors.System, e *delqueue.Entry, lock Lock) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if lock != nil {
		release, err := lock(ctx, e.ContainerID, e.IfName)
		if err != nil {
			return err
		}
		defer release()
	}
	if ep, ok := sys.Index.EndpointByAttachment(e.ContainerID, e.IfName); ok {
		err := deleteEndpoint(ctx, sys, ep.ID)
		if err != nil && !errors.Is(err, actors.ErrEndpointNotFound) {
			return fmt.Errorf("delete endpoint of container %s interface %s: %w", e.ContainerID, e.IfName, err)
		}
		return nil
	}
	for _, raw := range e.IPs {
		ip, err := netip.ParseAddr(raw)
		if err != nil {
			continue
		}
		row, ok := sys.Index.IP(ip.Unmap())
		if !ok || row.Endpoint != 0 || row.Owner != e.Owner() {
			continue
		}
		if _, err := sys.ReleaseIP(ctx, ip.Unmap(), ""); err != nil {
			return fmt.Errorf("release %s of container %s: %w", ip, e.ContainerID, err)
		}
	}
	if e.HostInterface == "" {
		return nil
	}
	dp := sys.Datapath
	gone := &endpoint.Endpoint{IfName: e.HostInterface, ContainerID: e.ContainerID}
	return runInPool(ctx, sys, "remove", func(ctx context.Context) error { return dp.Remove(ctx, gone) })
}

func deleteEndpoint(ctx context.Context, sys *actors.System, id endpoint.ID) error {
	_, err := sys.DeleteEndpoint(ctx, id, endpoint.DeleteOptions{})
	if errors.Is(err, actors.ErrEndpointDeleting) {
		return nil
	}
	return err
}

// runInPool runs fn in the datapath worker pool and waits for it.
func runInPool(ctx context.Context, sys *actors.System, op string, fn func(context.Context) error) error {
	_, err := sys.RunBlocking(ctx, op, 0, func(ctx context.Context) (any, error) { return nil, fn(ctx) })
	return err
}

// Submit returns a LinuxHooks.Submit that sends work to the pool without
// waiting for it.
func Submit(sys *actors.System) func(op string, fn func(context.Context) error) {
	return sys.SubmitBlocking
}

// DrainLoop drains dir every interval until ctx ends (it catches entries
// written while the agent was starting).
func DrainLoop(ctx context.Context, sys *actors.System, dir string, interval time.Duration, lock Lock, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := Drain(ctx, sys, dir, lock, log); err != nil {
				log.Warn("draining the delete queue", "err", err)
			}
		}
	}
}
