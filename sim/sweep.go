package sim

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"sort"
	"strings"
	"time"
)

// sweep removes what ambiguous failures may have left, as kubelet's
// repeated DELs and CNI GC would: endpoints created by a PUT whose
// failure was reported before it took effect, and addresses allocated by
// a POST whose answer was lost. Only pods the harness marked as suspects
// are touched; anything else left over is a violation for the checks. It
// reports whether it removed something.
func (e *engine) sweep(ctx context.Context) bool {
	removed := false
	eps, err := e.drv.Endpoints(ctx, simNamespace)
	if err != nil {
		e.note("sweep: listing endpoints: " + err.Error())
		return false
	}
	for _, ep := range eps {
		k, ok := parseContainerID(ep.ContainerID)
		if st, cur := e.m.classify(k); !ok || (cur && st != podFree) || !e.m.isSuspect(k, flagCreateUnknown) {
			continue
		}
		ref := PodRef{Namespace: simNamespace, Name: k.podName(), ContainerID: ep.ContainerID}
		if ep.Addressing != nil {
			ref.IPv4, _ = netip.ParseAddr(ep.Addressing.IPv4)
		}
		if _, err := e.drv.Del(ctx, ref); err != nil {
			e.note(fmt.Sprintf("sweep: DEL of %s: %v", ep.ContainerID, err))
			continue
		}
		e.zombiesSwept.Add(1)
		removed = true
	}
	allocs, err := e.drv.Allocations(ctx)
	if err != nil {
		e.note("sweep: listing addresses: " + err.Error())
		return removed
	}
	for _, a := range allocs {
		k, ok := parseOwner(a.Owner)
		if st, cur := e.m.classify(k); !ok || a.Endpoint != 0 || (cur && st != podFree) ||
			!e.m.isSuspect(k, flagIPAMUnknown|flagCreateUnknown) {
			continue
		}
		ip, err := netip.ParseAddr(a.IP)
		if err != nil {
			continue
		}
		if err := e.drv.Release(ctx, ip); err != nil {
			e.note(fmt.Sprintf("sweep: release %s: %v", ip, err))
			continue
		}
		e.ipsSwept.Add(1)
		removed = true
	}
	return removed
}

// goroutineSlack allows for goroutines of the runtime and the test
// framework that come and go.
const goroutineSlack = 4

// checkGoroutines waits for the goroutines of the stopped agents (API
// handlers of crashed agents wait out the API request timeout) and compares
// their number with the count before the first agent started.
func (e *engine) checkGoroutines(before int) {
	deadline := time.Now().Add(e.sc.APIRequestTimeout.D() + 5*time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= before+goroutineSlack {
			return
		}
		if time.Now().After(deadline) {
			e.violate(invLeakedGoroutines, "goroutines", "", fmt.Sprintf("%d goroutines after the agent stopped, %d before it started; "+
				"most common: %s", n, before, topGoroutines(5)), nil)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// topGoroutines names the functions most goroutines are in.
func topGoroutines(n int) string {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	counts := map[string]int{}
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		lines := strings.Split(string(g), "\n")
		if len(lines) > 1 {
			fn := lines[1]
			if i := strings.LastIndex(fn, "("); i > 0 {
				fn = fn[:i]
			}
			counts[fn]++
		}
	}
	type kv struct {
		fn string
		n  int
	}
	var all []kv
	for fn, c := range counts {
		all = append(all, kv{fn, c})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].n > all[j].n })
	var parts []string
	for i := 0; i < len(all) && i < n; i++ {
		parts = append(parts, fmt.Sprintf("%s x%d", all[i].fn, all[i].n))
	}
	return strings.Join(parts, ", ")
}
