package sim

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// probe creates one endpoint on every node once the churn and its faults
// are over (every agent running, etcd up) and waits until each is in
// every other node's ipcache with its identity, so that a run always
// times convergence at every other node. The churn's own endpoints are
// timed there only if no delete, crash or etcd restart overlapped their
// way, and under load a short churn can have none (issue 38). A probe not
// created, or not arrived everywhere, within MultiConfig.ProbeWait is a
// violation.
// Probes get label set 0 and stay (the drain keeps the even sets).
func (r *multiRun) probe(ctx context.Context, live [][]liveEP) []string {
	if ctx.Err() != nil { // the run was cancelled: nothing to measure
		return nil
	}
	// The wait bounds the probe's creation (retried while an agent that
	// just restarted refuses it) and its arrival at every other node.
	probeWait := r.cfg.ProbeWait
	ctx, cancel := context.WithTimeout(ctx, probeWait)
	defer cancel()
	ips := make([]netip.Addr, len(r.nodes))
	var (
		mu sync.Mutex
		v  []string
		wg sync.WaitGroup
	)
	for i, n := range r.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := driveResult{kinds: map[string]int{}}
			defer func() { r.account(i, d) }()
			pod := fmt.Sprintf("probe-%d", i)
			for {
				_, c, up := n.current()
				if !up {
					mu.Lock()
					v = append(v, fmt.Sprintf("convergence probe: %s is down", n.name))
					mu.Unlock()
					return
				}
				rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
				ep, err := createEndpoint(rctx, c, pod, "k8s:app=app0", r.conv)
				rcancel()
				if err == nil && (ep.Identity == nil || ep.Identity.ID <= 0) {
					err = fmt.Errorf("created without an identity")
				}
				if err == nil {
					ip, _ := netip.ParseAddr(ep.Addressing.IPv4)
					r.conv.created(i, ip, identity.NumericIdentity(ep.Identity.ID), time.Now())
					d.creates++
					r.changes.Add(1)
					live[i] = append(live[i], liveEP{id: ep.ID, ip: ip, set: 0})
					mu.Lock()
					ips[i] = ip
					mu.Unlock()
					return
				}
				d.fail(err)
				if sleepCtx(ctx, 100*time.Millisecond); ctx.Err() != nil {
					mu.Lock()
					v = append(v, fmt.Sprintf("convergence probe: %s: not created in %s: %v", n.name, probeWait, err))
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	for {
		var waiting []string
		for i, ip := range ips {
			if !ip.IsValid() {
				continue
			}
			for _, j := range r.conv.waitingAt(ip) {
				waiting = append(waiting, fmt.Sprintf("convergence probe %s from %s not in %s's ipcache after %s", ip, r.nodes[i].name, r.nodes[j].name, probeWait))
			}
		}
		if len(waiting) == 0 || ctx.Err() != nil {
			return slices.Concat(v, waiting)
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
}
