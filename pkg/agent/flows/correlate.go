package flows

import (
	"context"
	"maps"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/events"
)

// tuple keys a proxied connection: the client's and the server's
// "address:port" as the proxy's records name them (the server as the
// client addressed it: a Service's frontend). DNS records name no client
// port: their tuple is the endpoint and the server.
type tuple struct {
	src, dst string
	ep       uint16
}

// tuplesOf are the keys a redirected flow is found by: by both its
// destination and its Service frontend, and (for the DNS proxy) by
// endpoint and server.
func tuplesOf(fl *models.Flow) []tuple {
	src := net.JoinHostPort(fl.Source.IP, strconv.Itoa(int(fl.Source.Port)))
	dst := net.JoinHostPort(fl.Destination.IP, strconv.Itoa(int(fl.Destination.Port)))
	out := []tuple{{src: src, dst: dst}, {dst: dst, ep: fl.Endpoint}}
	if fl.Service != "" {
		out = append(out, tuple{src: src, dst: fl.Service}, tuple{dst: fl.Service, ep: fl.Endpoint})
	}
	return out
}

// Run correlates the L7 proxy's access records and the DNS proxy's
// queries (events of hub) with the redirected flows they belong to, and
// records each as a flow of its own (type l7, dns), until ctx ends.
func (s *Store) Run(ctx context.Context, hub *events.Hub) {
	if hub == nil {
		return
	}
	sub := hub.Subscribe(0)
	defer sub.Close()
	for {
		for {
			ev, ok := sub.TryNext()
			if !ok {
				break
			}
			switch ev.Type {
			case events.L7Access:
				if ev.L7 != nil {
					s.onL7(ev)
				}
			case events.DNSQuery:
				if ev.DNS != nil {
					s.onDNS(ev)
				}
			}
		}
		select {
		case <-sub.Ready():
		case <-ctx.Done():
			return
		}
	}
}

// onL7 attaches an HTTP (or Kafka) request to its connection's flow (the first
// request of the connection) and records it as an l7 flow.
func (s *Store) onL7(ev events.Event) {
	r := ev.L7
	rec := &models.FlowL7{Protocol: r.Protocol, Verdict: r.Verdict, Method: r.Method, Path: r.Path, Host: r.Host,
		Code: r.Code, Reason: r.Reason}
	if k := r.Kafka; k != nil {
		rec.Kafka = &models.FlowKafka{APIKey: k.APIKey, APIVersion: k.APIVersion, CorrelationID: k.CorrelationID,
			ClientID: k.ClientID, Topics: k.Topics, ErrorCode: k.ErrorCode}
	}
	fl := models.Flow{Time: ev.Time, Node: s.cfg.Node, Type: TypeL7, Verdict: r.Verdict, Direction: r.Direction,
		Endpoint: ev.Endpoint, Protocol: "TCP", L7: rec}
	fl.Source = s.l7Peer(r.Src, r.SrcIdentity)
	fl.Destination = s.l7Peer(r.Dst, r.DstIdentity)
	if !s.admit() {
		return
	}
	if m := s.cfg.Metrics; m != nil {
		m.Flow(fl.Type, fl.Verdict, "", fl.Source.Namespace, fl.Destination.Namespace)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq, ok := s.proxied[tuple{src: r.Src, dst: r.Dst}]; ok {
		if l4 := &s.ring[seq%s.capacity()]; l4.L7 == nil {
			l4.L7 = rec
		}
	} else {
		s.earlyLocked(tuple{src: r.Src, dst: r.Dst}, earlyRecord{l7: rec, at: s.cfg.Now()})
	}
	s.addLocked(fl)
}

// onDNS attaches a DNS query to the endpoint's redirected flow to the
// server and records it as a dns flow.
func (s *Store) onDNS(ev events.Event) {
	d := ev.DNS
	if d.Verdict == "allowed" {
		s.names.learn(d.Query, d.IPs, time.Duration(d.TTL)*time.Second, s.cfg.Now())
	}
	rec := &models.FlowDNS{Query: d.Query, QType: d.QType, Verdict: d.Verdict, RCode: d.RCode, IPs: d.IPs}
	fl := models.Flow{Time: ev.Time, Node: s.cfg.Node, Type: TypeDNS, Verdict: d.Verdict, Direction: "egress",
		Endpoint: ev.Endpoint, Protocol: "UDP", DNS: rec}
	s.describeEndpoint(&fl.Source, endpoint.ID(ev.Endpoint))
	fl.Source.Identity = d.Identity
	if host, port, err := net.SplitHostPort(d.Server); err == nil {
		p, _ := strconv.Atoi(port)
		fl.Destination.IP, fl.Destination.Port = host, uint16(p)
	}
	if !s.admit() {
		return
	}
	if m := s.cfg.Metrics; m != nil {
		m.Flow(fl.Type, fl.Verdict, "", fl.Source.Namespace, fl.Destination.Namespace)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq, ok := s.proxied[tuple{dst: d.Server, ep: ev.Endpoint}]; ok {
		if l4 := &s.ring[seq%s.capacity()]; l4.DNS == nil {
			l4.DNS = rec
		}
	} else {
		s.earlyLocked(tuple{dst: d.Server, ep: ev.Endpoint}, earlyRecord{dns: rec, at: s.cfg.Now()})
	}
	s.addLocked(fl)
}

// l7Peer describes one side of an L7 record ("address:port").
func (s *Store) l7Peer(hostport string, ident uint32) models.FlowPeer {
	p := models.FlowPeer{Identity: ident}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return p
	}
	n, _ := strconv.Atoi(port)
	p.IP, p.Port = host, uint16(n)
	if addr, err := netip.ParseAddr(host); err == nil {
		s.describePeer(&p, addr)
	}
	return p
}

// earlyRecord is an L7 or DNS record that came before its redirected
// flow, and when.
type earlyRecord struct {
	l7  *models.FlowL7
	dns *models.FlowDNS
	at  time.Time
}

// Bounds of the early records: at most maxEarly, each for earlyTTL.
const (
	maxEarly = 1024
	earlyTTL = 10 * time.Second
)

// earlyLocked keeps r for k's redirected flow to come; a full table
// first forgets what is older than earlyTTL, then refuses.
func (s *Store) earlyLocked(k tuple, r earlyRecord) {
	if len(s.early) >= maxEarly {
		now := s.cfg.Now()
		maps.DeleteFunc(s.early, func(_ tuple, e earlyRecord) bool { return now.Sub(e.at) > earlyTTL })
		if len(s.early) >= maxEarly {
			return
		}
	}
	s.early[k] = r
}
