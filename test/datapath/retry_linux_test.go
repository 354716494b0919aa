package datapath_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/cnidrain"
	"github.com/membrane-cni/membrane/pkg/clients/cni"
	"github.com/membrane-cni/membrane/pkg/clients/cni/delqueue"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

// TestRetriedAddWhileFirstInFlight: the runtime retries an ADD the
// plugin gave up on while the agent still runs the first (a zombie ADD,
// here held in its pod-labels lookup, the step that waits on the API
// server). The retry waits for the zombie and then replaces it: it
// succeeds (never 409), and the attachment ends with one working
// endpoint, the retry's, with the retry's address in the pod and no
// address of the zombie left allocated. Without the per-attachment
// serialisation the zombie, finishing last, replaced the retry's
// endpoint (or, caught between its veth and its endpoint, made the
// retry's creation fail with 409).
func TestRetriedAddWhileFirstInFlight(t *testing.T) {
	e := newEnv(t, "10.244.23.0/24")
	startAgent(e, nil)
	gw := netip.MustParseAddr("10.244.23.1")
	p := e.NewPod("zombie")

	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	releaseOnce := func() { once.Do(func() { close(release) }) }
	defer releaseOnce()
	var calls sync.Mutex
	first := true
	e.Agent.Server.SetLabeler(func(ctx context.Context, spec *endpoint.Endpoint) (labels.Labels, policy.NamedPorts, error) {
		calls.Lock()
		hold := first
		first = false
		calls.Unlock()
		if hold { // the zombie: stalled, not minding its caller's deadline
			close(entered)
			<-release
		}
		return spec.Labels, spec.NamedPorts, nil
	})

	type answer struct {
		res *types100.Result
		err error
	}
	// The runtime gave up on the zombie: its answer stays out of the
	// result cache CHECK reads (with one cache, the zombie's plugin
	// exiting after the retry's under load left its address there).
	add := func(zombie bool) <-chan answer {
		ch := make(chan answer, 1)
		go func() {
			var a answer
			a.err = e.Do(func(ctx context.Context) error {
				if zombie {
					a.res, a.err = e.AddRTDiscarded(ctx, p.RT)
				} else {
					a.res, a.err = e.AddRT(ctx, p.RT)
				}
				return a.err
			})
			ch <- a
		}()
		return ch
	}
	zombie := add(true)
	select {
	case <-entered:
	case a := <-zombie:
		t.Fatalf("first ADD ended before its labels lookup was held: %+v %v", a.res, a.err)
	}
	retry := add(false)
	// The retry must not overtake the zombie; give it the time of a
	// whole ADD to show it does (it ends early only without the
	// serialisation), then let the zombie go on.
	var got answer
	var retryDone bool
	select {
	case got = <-retry:
		retryDone = true
	case <-time.After(5 * time.Second):
	}
	releaseOnce()
	z := <-zombie
	if !retryDone {
		got = <-retry
	}
	if got.err != nil {
		t.Fatalf("retried ADD: %v (zombie ADD: %v)", got.err, z.err)
	}
	retryIP := podIP(t, got.res, p, gw)
	verifyPod(t, p, retryIP, gw)
	eps, err := e.Client().EndpointList(context.Background(), nil)
	if err != nil || len(eps) != 1 || eps[0].Addressing == nil || eps[0].Addressing.IPv4 != retryIP.String() {
		t.Fatalf("endpoints after the retried ADD = %+v, %v; want one with the retry's %s (zombie: %+v, %v)", eps, err, retryIP, z.res, z.err)
	}
	if eps[0].State != "ready" {
		t.Fatalf("endpoint %d is %s, want ready", eps[0].ID, eps[0].State)
	}
	if all := allocations(t, e); len(all) != 1 || all[0].IP != retryIP.String() {
		t.Fatalf("allocations = %+v, want only the retry's %s", all, retryIP)
	}
	if !hostLinkExists(t, e, p) {
		t.Fatal("the retry's host veth is gone")
	}
	if out, err := p.NS.Exec("ping", "-c", "1", "-W", "5", gw.String()); err != nil {
		t.Fatalf("ping gateway after the retried ADD: %v\n%s", err, out)
	}
	if err := e.Check(p); err != nil {
		t.Fatalf("CHECK after the retried ADD: %v", err)
	}
	if err := e.Del(p); err != nil {
		t.Fatalf("DEL: %v", err)
	}
}

// TestConcurrentAddsOfOneAttachment: two ADDs of one attachment sent
// together, round after round (a runtime's retry racing the ADD it gave
// up on, with no stall to order them): both succeed (no 409 from the
// endpoint manager's uniqueness check, no interface-exists), and the
// attachment ends with one ready endpoint, the one answered last, whose
// address is the pod's, with no other address left allocated.
func TestConcurrentAddsOfOneAttachment(t *testing.T) {
	e := newEnv(t, "10.244.24.0/24")
	startAgent(e, nil)
	gw := netip.MustParseAddr("10.244.24.1")
	p := e.NewPod("racing")
	type answer struct {
		res *types100.Result
		err error
	}
	add := func(ch chan<- answer) {
		var a answer
		a.err = e.Do(func(ctx context.Context) error {
			a.res, a.err = e.AddRT(ctx, p.RT)
			return a.err
		})
		ch <- a
	}
	for round := range 6 {
		ch := make(chan answer, 2)
		go add(ch)
		go add(ch)
		a, b := <-ch, <-ch
		if a.err != nil || b.err != nil {
			t.Fatalf("round %d: ADDs of one attachment together: %v; %v", round, a.err, b.err)
		}
		// The last ADD is the one the agent ran last (attachLocks order
		// them), whose endpoint is left: not necessarily the one whose
		// plugin process returned last to the test under load.
		eps, err := e.Client().EndpointList(context.Background(), nil)
		if err != nil || len(eps) != 1 || eps[0].Addressing == nil || eps[0].State != "ready" {
			t.Fatalf("round %d: endpoints = %+v, %v; want one ready", round, eps, err)
		}
		ipA, ipB := podIP(t, a.res, p, gw), podIP(t, b.res, p, gw)
		ip := ipA
		if eps[0].Addressing.IPv4 == ipB.String() {
			ip = ipB
		}
		if eps[0].Addressing.IPv4 != ip.String() {
			t.Fatalf("round %d: endpoint %d has %s, want one of the answers' %s, %s", round, eps[0].ID, eps[0].Addressing.IPv4, ipA, ipB)
		}
		verifyPod(t, p, ip, gw)
		if all := allocations(t, e); len(all) != 1 || all[0].IP != ip.String() {
			t.Fatalf("round %d: allocations = %+v, want only %s", round, all, ip)
		}
	}
	if out, err := p.NS.Exec("ping", "-c", "1", "-W", "5", gw.String()); err != nil {
		t.Fatalf("ping gateway: %v\n%s", err, out)
	}
	if err := e.Del(p); err != nil {
		t.Fatalf("DEL: %v", err)
	}
}

// TestAddReplacesEndpointWithoutVeth: an endpoint of the attachment
// whose veth is gone (what an ADD the plugin gave up on leaves when the
// endpoint it asked for is created after its own rollback looked for
// it) is replaced by the next ADD of the attachment, not answered with
// 409 by the endpoint manager's uniqueness check.
func TestAddReplacesEndpointWithoutVeth(t *testing.T) {
	e := newEnv(t, "10.244.25.0/24")
	startAgent(e, func(c *agent.Config) { c.GCInterval = time.Hour }) // the GC would collect it first
	gw := netip.MustParseAddr("10.244.25.1")
	p := e.NewPod("orphan")
	first := podIP(t, e.MustAdd(p), p, gw)
	host, _ := cni.VethNames(p.RT.ContainerID, p.RT.IfName)
	nl := e.NS.Netlink(t)
	link, err := nl.LinkByName(host)
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkDel(link); err != nil { // the pair goes with it
		t.Fatal(err)
	}
	res, err := e.Add(p)
	if err != nil {
		t.Fatalf("ADD over an endpoint without its veth: %v", err)
	}
	ip := podIP(t, res, p, gw)
	verifyPod(t, p, ip, gw)
	eps, err := e.Client().EndpointList(context.Background(), nil)
	if err != nil || len(eps) != 1 || eps[0].Addressing == nil || eps[0].Addressing.IPv4 != ip.String() || eps[0].State != "ready" {
		t.Fatalf("endpoints = %+v, %v; want one ready with %s", eps, err, ip)
	}
	if first != ip && allocated(t, e, first) {
		t.Fatalf("address %s of the stale endpoint still allocated", first)
	}
	if out, err := p.NS.Exec("ping", "-c", "1", "-W", "5", gw.String()); err != nil {
		t.Fatalf("ping gateway: %v\n%s", err, out)
	}
	if err := e.Del(p); err != nil {
		t.Fatalf("DEL: %v", err)
	}
}

// TestDelWhileAddInFlight: the runtime gives up on an ADD and sends DEL
// while the agent still runs the ADD (held here in its pod-labels
// lookup). The DEL waits for that ADD, then deletes what it made: the
// attachment ends with no endpoint, no address allocated and no host
// veth. Answered at once instead ("no such endpoint"), the DEL left the
// endpoint the ADD then created behind, with its address and veth, for
// a pod that no longer exists. The same for a DEL the plugin queued (the
// agent's delete-queue drain holds the attachment as the API does).
func TestDelWhileAddInFlight(t *testing.T) {
	e := newEnv(t, "10.244.25.0/24")
	startAgent(e, nil)
	del := map[string]func(p *nodeharness.Pod) error{
		"plugin-del": e.Del,
		"queued-del": func(p *nodeharness.Pod) error {
			hostName, _ := cni.VethNames(p.RT.ContainerID, p.RT.IfName)
			if _, err := delqueue.Write(e.DeleteQueue, &delqueue.Entry{ContainerID: p.RT.ContainerID, IfName: p.RT.IfName,
				Netns: p.RT.NetNS, HostInterface: hostName, Queued: time.Now().UTC()}); err != nil {
				return err
			}
			_, err := cnidrain.Drain(context.Background(), e.Agent.System, e.DeleteQueue, e.Agent.Server.LockAttachment,
				slog.New(slog.NewTextHandler(io.Discard, nil)))
			return err
		},
	}
	for _, name := range []string{"plugin-del", "queued-del"} {
		t.Run(name, func(t *testing.T) { delWhileAddInFlight(t, e, del[name]) })
	}
}

func delWhileAddInFlight(t *testing.T, e *nodeharness.Node, del func(p *nodeharness.Pod) error) {
	p := e.NewPod("given-up")
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	releaseOnce := func() { once.Do(func() { close(release) }) }
	defer releaseOnce()
	e.Agent.Server.SetLabeler(func(ctx context.Context, spec *endpoint.Endpoint) (labels.Labels, policy.NamedPorts, error) {
		close(entered)
		<-release // stalled, not minding its caller's deadline
		return spec.Labels, spec.NamedPorts, nil
	})
	added := make(chan error, 1)
	go func() {
		added <- e.Do(func(ctx context.Context) error { _, err := e.AddRT(ctx, p.RT); return err })
	}()
	<-entered
	deleted := make(chan error, 1)
	go func() { deleted <- del(p) }()
	select {
	case err := <-deleted:
		t.Logf("DEL answered while the ADD was in flight: %v", err)
	case <-time.After(2 * time.Second):
		releaseOnce()
		if err := <-deleted; err != nil {
			t.Fatalf("DEL after the ADD in flight finished: %v", err)
		}
	}
	releaseOnce()
	if err := <-added; err != nil {
		t.Logf("the given-up ADD: %v", err)
	}
	eps, err := e.Client().EndpointList(context.Background(), nil)
	if err != nil || len(eps) != 0 {
		t.Fatalf("endpoints after the DEL = %+v, %v; want none", eps, err)
	}
	if all := allocations(t, e); len(all) != 0 {
		t.Errorf("allocations after the DEL = %+v, want none", all)
	}
	testutil.EventuallyErr(t, "the host veth gone", func() error {
		if hostLinkExists(t, e, p) {
			return errors.New("still there")
		}
		return nil
	})
}
