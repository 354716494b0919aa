package proxy

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/netip"
	"time"

	"github.com/membrane-cni/membrane/datapath/l7proxy/xdsapi"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// The Kafka listener. Each redirected connection gets one upstream
// connection (marked with the client's identity, as the HTTP proxy's)
// and two goroutines: the reader parses each request, decides it and
// forwards it or queues the proxy's own answer; the writer answers the
// client in request order, the broker's responses for forwarded
// requests (read one by one: Kafka answers a connection's requests in
// order) and the denials in between. A denied request thus gets its
// TOPIC_AUTHORIZATION_FAILED answer in its place and the connection
// goes on; an unparsable one closes the connection after the answers
// already due.

// Bounds of one Kafka connection: requests awaiting their answer (the
// reader waits beyond), and how long the answers still due may take
// once the client stopped sending.
const (
	kafkaInFlight   = 256
	kafkaDrainAfter = 30 * time.Second
)

// kafkaSlot is one answer the client is due, in request order: the
// broker's (forward; apiVersions when it answers ApiVersions, version
// the request's) or the proxy's denial.
type kafkaSlot struct {
	forward     bool
	apiVersions bool
	version     int16
	denial      []byte
}

// serveKafka accepts redirected connections on lis until ctx ends.
func (p *proxy) serveKafka(ctx context.Context, lis net.Listener) {
	go func() {
		<-ctx.Done()
		_ = lis.Close()
	}()
	p.log.Info("kafka proxy serving", "listen", lis.Addr().String())
	for {
		c, err := lis.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			p.log.Warn("kafka accept", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		go p.kafkaConn(ctx, c)
	}
}

// kafkaConn proxies one client connection.
func (p *proxy) kafkaConn(ctx context.Context, client net.Conn) {
	defer client.Close()
	src := client.RemoteAddr().(*net.TCPAddr).AddrPort()
	local := client.LocalAddr().(*net.TCPAddr).AddrPort()
	if local.Port() == p.kafkaPort {
		return // not redirected: Kafka has no explicit proxy form
	}
	srcAddr := src.Addr().Unmap()
	src = netip.AddrPortFrom(srcAddr, src.Port())
	dst := netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
	st := p.state.Load()
	d := upstreamDialer(st.identityOf(srcAddr), st.upstreamSource(srcAddr))
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	up, err := d.DialContext(dctx, "tcp", dst.String())
	cancel()
	if err != nil {
		p.log.Debug("kafka upstream", "dst", dst, "err", err)
		return
	}
	defer up.Close()
	slots := make(chan kafkaSlot, kafkaInFlight)
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.kafkaAnswers(client, up, slots)
	}()
	p.kafkaRequests(client, up, src, dst, slots)
	close(slots)
	// The answers already due still reach the client; the broker sees
	// the end of the requests.
	if tc, ok := up.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	t := time.AfterFunc(kafkaDrainAfter, func() { _ = client.Close(); _ = up.Close() })
	defer t.Stop()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// kafkaRequests reads, decides and forwards the client's requests
// until it stops, a request is unparsable or the broker is gone.
func (p *proxy) kafkaRequests(client, up net.Conn, src, dst netip.AddrPort, slots chan<- kafkaSlot) {
	br := bufio.NewReaderSize(client, 64<<10)
	var buf []byte
	for {
		frame, err := readKafkaFrame(br, buf)
		if err != nil {
			if errors.Is(err, errKafkaRequest) {
				p.kafkaRefused(src, dst, err)
			}
			return
		}
		buf = frame
		req, err := parseKafkaRequest(frame)
		if err != nil {
			p.kafkaRefused(src, dst, err)
			return
		}
		st := p.state.Load()
		d := st.kafkaVerdict(src.Addr(), dst.Addr(), dst.Port(), &req.KafkaRequest)
		rec := kafkaRecord(src, dst, d, req)
		if d.allowed {
			p.access.log(rec)
			if _, err := up.Write(frame); err != nil {
				return
			}
			if req.expectsResponse() {
				slots <- kafkaSlot{forward: true, apiVersions: req.APIKey == policy.KafkaAPIVersions, version: req.APIVersion}
			}
			continue
		}
		if !req.expectsResponse() {
			p.access.log(rec)
			continue
		}
		resp := denialResponse(req)
		if resp == nil {
			rec.Kafka.ErrorCode = 0
			rec.Reason += "; no error response for this API key: connection closed"
			p.access.log(rec)
			return
		}
		p.access.log(rec)
		slots <- kafkaSlot{denial: resp}
	}
}

// kafkaAnswers writes the client's answers in request order until
// slots is closed and drained; on an error it closes both connections
// (ending the reader) and drains slots.
func (p *proxy) kafkaAnswers(client, up net.Conn, slots <-chan kafkaSlot) {
	br := bufio.NewReaderSize(up, 64<<10)
	var buf []byte
	for s := range slots {
		out := s.denial
		if s.forward {
			frame, err := readKafkaFrame(br, buf)
			if err != nil {
				break
			}
			buf, out = frame, frame
			if s.apiVersions {
				out = clampAPIVersions(frame, s.version)
			}
		}
		if _, err := client.Write(out); err != nil {
			break
		}
	}
	_ = client.Close()
	_ = up.Close()
	for range slots {
	}
}

// kafkaRefused records an unparsable request (the connection closes).
func (p *proxy) kafkaRefused(src, dst netip.AddrPort, err error) {
	st := p.state.Load()
	p.access.log(xdsapi.AccessRecord{Time: time.Now(), Src: src, Dst: dst, SrcIdentity: uint32(st.identityOf(src.Addr())),
		DstIdentity: uint32(st.identityOf(dst.Addr())), Reason: err.Error() + ": connection closed", Kafka: &xdsapi.KafkaAccess{}})
}

func kafkaRecord(src, dst netip.AddrPort, d decision, req *kafkaRequest) xdsapi.AccessRecord {
	rec := xdsapi.AccessRecord{Time: time.Now(), Endpoint: d.endpoint, Direction: d.dir.String(), Src: src, Dst: dst,
		SrcIdentity: uint32(d.srcID), DstIdentity: uint32(d.dstID), Allowed: d.allowed, Reason: d.reason,
		Kafka: &xdsapi.KafkaAccess{APIKey: policy.KafkaAPIKeyName(req.APIKey), APIVersion: req.APIVersion,
			CorrelationID: req.CorrelationID, ClientID: req.ClientID, Topics: req.Topics}}
	if len(rec.Kafka.Topics) > 64 {
		rec.Kafka.Topics = rec.Kafka.Topics[:64]
	}
	if !d.allowed {
		rec.Kafka.ErrorCode = kafkaTopicAuthorizationFailed
	}
	return rec
}

// kafkaVerdict decides a Kafka request from src to dst:port as verdict
// decides an HTTP one (decide): every side with rules on the connection
// must allow it (KafkaAllowed), and at least one side must have rules.
func (s *state) kafkaVerdict(src, dst netip.Addr, port uint16, r *policy.KafkaRequest) decision {
	return decide(s, src, dst, port, "kafka rules", (*compiledEndpoint).kafkaRules, func(rules []*policy.CompiledKafkaRule) (bool, []policy.HeaderMismatch) {
		return policy.KafkaAllowed(rules, r), nil
	})
}
