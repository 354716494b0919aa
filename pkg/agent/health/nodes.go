package health

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/index"
)

// Node states in models.NodeHealth.
const (
	NodeOK          = "ok"          // every address answered ICMP and HTTP
	NodeDegraded    = "degraded"    // some probes answered, some not
	NodeUnreachable = "unreachable" // nothing answered
	NodeProbing     = "probing"     // not probed yet
)

// Probe names (metrics' probe label): of the node's addresses, and of
// its health endpoint's.
const (
	ProbeICMP       = "icmp"
	ProbeHTTP       = "http"
	ProbeHealthICMP = "health-icmp"
	ProbeHealthHTTP = "health-http"
)

// maxHTTPProbes bounds the HTTP probes in flight in one round.
const maxHTTPProbes = 32

// NodeMetrics receives each probe's result and forgets nodes that left
// (the agent's Prometheus metrics); nil: none.
type NodeMetrics interface {
	NodeProbe(node, probe string, ok bool, rtt time.Duration)
	// ForgetProbes drops a node's series of the probes named (its health
	// endpoint no longer published).
	ForgetProbes(node string, probes ...string)
	ForgetNode(node string)
}

// nodeProber probes every remote node of the index, as cilium-health's
// node probes do: an ICMP echo and an HTTP GET of the node responder
// (Port, Path, on every address of the node, in its host netns) per
// node address, and the same of the node's health endpoint (its
// responder in its own netns) per address the node published and the
// nodes actor accepted (index.Node.HealthIPs), every interval. Results go to Matrix, an event on every
// change of a node's state, and the metrics. It runs on its own
// goroutine, never in an actor; sockets are opened in the host netns.
type nodeProber struct {
	ix       *index.Index
	dp       datapath.HealthDatapath
	hub      *events.Hub
	met      NodeMetrics
	log      *slog.Logger
	interval time.Duration
	timeout  time.Duration
	http     *http.Client

	mu    sync.Mutex
	nodes map[string]*models.NodeHealth
	srv   *http.Server
}

// startNodeProber starts the node responder and the probe rounds; the
// responder failing to listen is logged and retried at every round
// (another node's probes then see this one unreachable over HTTP).
func startNodeProber(ctx context.Context, cfg Config, ix *index.Index, dp datapath.HealthDatapath, hub *events.Hub, log *slog.Logger) (*nodeProber, <-chan struct{}) {
	p := &nodeProber{ix: ix, dp: dp, hub: hub, met: cfg.NodeMetrics, log: log, interval: cfg.NodeInterval, timeout: cfg.ProbeTimeout,
		nodes: map[string]*models.NodeHealth{}}
	p.http = &http.Client{Timeout: cfg.ProbeTimeout, Transport: &http.Transport{DialContext: dp.DialHost, DisableKeepAlives: true}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer p.closeServer()
		t := time.NewTicker(p.interval)
		defer t.Stop()
		for {
			p.ensureServer()
			p.round(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return p, done
}

// ensureServer starts the node responder on Port of every host address,
// if it does not run.
func (p *nodeProber) ensureServer() {
	p.mu.Lock()
	up := p.srv != nil
	p.mu.Unlock()
	if up {
		return
	}
	var lis net.Listener
	err := p.dp.InHost(func() (err error) {
		lis, err = net.Listen("tcp", ":"+strconv.Itoa(Port))
		return err
	})
	if err != nil {
		p.log.Warn("node health responder cannot listen; other nodes see this one unreachable over HTTP", "port", Port, "err", err)
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+Path, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second,
		WriteTimeout: 5 * time.Second, IdleTimeout: 10 * time.Second, MaxHeaderBytes: 4096}
	go func() { _ = srv.Serve(lis) }()
	p.mu.Lock()
	p.srv = srv
	p.mu.Unlock()
}

func (p *nodeProber) closeServer() {
	p.mu.Lock()
	srv := p.srv
	p.srv = nil
	p.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// target is one address of one node: a node address, or (health) one
// of its health endpoint's.
type target struct {
	node   string
	addr   netip.Addr
	health bool
}

// round probes every active remote node once.
func (p *nodeProber) round(ctx context.Context) {
	var targets []target
	names := map[string]bool{}
	for _, n := range p.ix.Nodes() {
		if !n.Active || names[n.Name] {
			continue
		}
		names[n.Name] = true
		for _, a := range n.Addrs {
			targets = append(targets, target{n.Name, a, false})
		}
		for _, a := range n.HealthIPs {
			targets = append(targets, target{n.Name, a, true})
		}
	}
	p.forgetGone(names)
	if len(targets) == 0 {
		return
	}
	type result struct{ icmp, http models.ProbeResult }
	results := make(map[target]*result, len(targets))
	for _, t := range targets {
		results[t] = &result{}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // one ICMP socket per family for the whole round
		defer wg.Done()
		pings := p.pingAll(ctx, targets)
		for _, t := range targets {
			results[t].icmp = pings[t.addr]
		}
	}()
	sem := make(chan struct{}, maxHTTPProbes)
	for _, t := range targets {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			results[t].http = p.get(ctx, t.addr)
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	byNode := map[string]*models.NodeHealth{}
	for _, t := range targets {
		r := results[t]
		n := byNode[t.node]
		if n == nil {
			n = &models.NodeHealth{Name: t.node}
			byNode[t.node] = n
		}
		ah := models.NodeAddrHealth{IP: t.addr.String(), ICMP: r.icmp, HTTP: r.http}
		if t.health {
			n.HealthEndpoint = append(n.HealthEndpoint, ah)
		} else {
			n.Addresses = append(n.Addresses, ah)
		}
	}
	now := time.Now().UTC()
	for name, n := range byNode {
		p.record(name, n.Addresses, n.HealthEndpoint, now)
	}
}

// record stores a node's round (the probes of its addresses and of its
// health endpoint's), publishing an event when its state changed and its
// probes to the metrics.
func (p *nodeProber) record(name string, addrs, healthAddrs []models.NodeAddrHealth, now time.Time) {
	ok, total := 0, 0
	var failed []string
	allOK := map[string]bool{ProbeICMP: true, ProbeHTTP: true, ProbeHealthICMP: true, ProbeHealthHTTP: true}
	slowest := map[string]float64{}
	for _, set := range []struct {
		icmp, http, what string
		addrs            []models.NodeAddrHealth
	}{{ProbeICMP, ProbeHTTP, "", addrs}, {ProbeHealthICMP, ProbeHealthHTTP, "health endpoint ", healthAddrs}} {
		for _, a := range set.addrs {
			for _, pr := range []struct {
				name string
				r    models.ProbeResult
			}{{set.icmp, a.ICMP}, {set.http, a.HTTP}} {
				total++
				if pr.r.OK {
					ok++
				} else {
					failed = append(failed, fmt.Sprintf("%s%s %s: %s", set.what, strings.TrimPrefix(pr.name, "health-"), a.IP, pr.r.Error))
				}
				allOK[pr.name] = allOK[pr.name] && pr.r.OK
				slowest[pr.name] = max(slowest[pr.name], pr.r.LatencyMS)
			}
		}
	}
	if p.met != nil {
		probes := []string{ProbeICMP, ProbeHTTP}
		if len(healthAddrs) > 0 {
			probes = append(probes, ProbeHealthICMP, ProbeHealthHTTP)
		} else {
			p.met.ForgetProbes(name, ProbeHealthICMP, ProbeHealthHTTP)
		}
		for _, probe := range probes {
			p.met.NodeProbe(name, probe, allOK[probe], time.Duration(slowest[probe]*float64(time.Millisecond)))
		}
	}
	state := NodeDegraded
	switch ok {
	case total:
		state = NodeOK
	case 0:
		state = NodeUnreachable
	}
	p.mu.Lock()
	prev := p.nodes[name]
	cur := &models.NodeHealth{Name: name, State: state, Addresses: addrs, HealthEndpoint: healthAddrs, LastProbe: now, Since: now}
	changed := prev == nil || prev.State != state
	if !changed {
		cur.Since = prev.Since
	}
	p.nodes[name] = cur
	p.mu.Unlock()
	if !changed || (prev == nil && state == NodeOK) {
		return
	}
	from := NodeProbing
	if prev != nil {
		from = prev.State
	}
	msg := fmt.Sprintf("node %s: %s (was %s)", name, state, from)
	if len(failed) > 0 {
		msg += ": " + strings.Join(failed, "; ")
	}
	if state == NodeOK {
		p.log.Info("node reachable again", "node", name, "was", from)
	} else {
		p.log.Warn("node health probes failing", "node", name, "state", state, "failed", failed)
	}
	if p.hub != nil {
		p.hub.Publish(events.Event{Type: events.NodeHealth, Node: name, State: state, PrevState: from, Message: msg})
	}
}

// forgetGone drops the nodes no longer in the index.
func (p *nodeProber) forgetGone(names map[string]bool) {
	p.mu.Lock()
	var gone []string
	for n := range p.nodes {
		if !names[n] {
			gone = append(gone, n)
			delete(p.nodes, n)
		}
	}
	p.mu.Unlock()
	if p.met != nil {
		for _, n := range gone {
			p.met.ForgetNode(n)
		}
	}
}

// Matrix returns every remote node's last round, by name.
func (p *nodeProber) Matrix() []models.NodeHealth {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]models.NodeHealth, 0, len(p.nodes))
	for _, n := range p.nodes {
		c := *n
		c.Addresses = slices.Clone(n.Addresses)
		c.HealthEndpoint = slices.Clone(n.HealthEndpoint)
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b models.NodeHealth) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// get is one HTTP probe of addr's node responder.
func (p *nodeProber) get(ctx context.Context, addr netip.Addr) models.ProbeResult {
	url := "http://" + net.JoinHostPort(addr.String(), strconv.Itoa(Port)) + Path
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return models.ProbeResult{Error: err.Error()}
	}
	resp, err := p.http.Do(req)
	if err != nil {
		return models.ProbeResult{Error: err.Error()}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return models.ProbeResult{Error: fmt.Sprintf("status %d", resp.StatusCode)}
	}
	return models.ProbeResult{OK: true, LatencyMS: ms(time.Since(start))}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// pingAll sends one ICMP echo request to every target address (one raw
// socket per family, opened in the host netns) and waits up to the probe
// timeout for the replies.
func (p *nodeProber) pingAll(ctx context.Context, targets []target) map[netip.Addr]models.ProbeResult {
	out := map[netip.Addr]models.ProbeResult{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, v6 := range []bool{false, true} {
		var addrs []netip.Addr
		for _, t := range targets {
			if t.addr.Is6() == v6 && !slices.Contains(addrs, t.addr) {
				addrs = append(addrs, t.addr)
			}
		}
		if len(addrs) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := p.ping(ctx, v6, addrs)
			mu.Lock()
			for a, r := range res {
				out[a] = r
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// pingSeq numbers the rounds' echo requests, so that a late reply to an
// earlier round is never taken for this one's.
var pingSeq atomic.Uint32

func (p *nodeProber) ping(ctx context.Context, v6 bool, addrs []netip.Addr) map[netip.Addr]models.ProbeResult {
	out := make(map[netip.Addr]models.ProbeResult, len(addrs))
	fail := func(err error) map[netip.Addr]models.ProbeResult {
		for _, a := range addrs {
			out[a] = models.ProbeResult{Error: err.Error()}
		}
		return out
	}
	network, listen, proto := "ip4:icmp", "0.0.0.0", 1
	var typ, reply icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
	if v6 {
		network, listen, proto = "ip6:ipv6-icmp", "::", 58
		typ, reply = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
	}
	var c *icmp.PacketConn
	if err := p.dp.InHost(func() (err error) {
		c, err = icmp.ListenPacket(network, listen)
		return err
	}); err != nil {
		return fail(fmt.Errorf("icmp socket: %w", err))
	}
	defer c.Close()
	seq := int(pingSeq.Add(1) & 0xffff)
	id := os.Getpid() & 0xffff
	payload := []byte(fmt.Sprintf("membrane-health-%d", seq))
	msg, err := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: id, Seq: seq, Data: payload}}).Marshal(nil)
	if err != nil {
		return fail(err)
	}
	sent := map[netip.Addr]time.Time{}
	for _, a := range addrs {
		if _, err := c.WriteTo(msg, &net.IPAddr{IP: a.AsSlice()}); err != nil {
			out[a] = models.ProbeResult{Error: err.Error()}
			continue
		}
		sent[a] = time.Now()
	}
	deadline := time.Now().Add(p.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = c.SetReadDeadline(deadline)
	buf := make([]byte, 1500)
	for len(sent) > 0 {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			break // the deadline: what has not answered failed
		}
		m, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil || m.Type != reply {
			continue
		}
		e, ok := m.Body.(*icmp.Echo)
		ip, _ := from.(*net.IPAddr)
		if !ok || ip == nil || e.Seq != seq || !bytes.Equal(e.Data, payload) {
			continue
		}
		a, _ := netip.AddrFromSlice(ip.IP)
		a = a.Unmap()
		if at, ok := sent[a]; ok {
			out[a] = models.ProbeResult{OK: true, LatencyMS: ms(time.Since(at))}
			delete(sent, a)
		}
	}
	for a := range sent {
		out[a] = models.ProbeResult{Error: fmt.Sprintf("no echo reply within %s", p.timeout)}
	}
	return out
}
