package l7

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/membrane-cni/membrane/pkg/domain/events"
)

// kafkaPort is the broker's port on pod b.
const kafkaPort = 9092

// kafkaPolicy: b's ingress on 9092 lets a fetch metadata and versions,
// get a producer ID (idempotent producers, franz-go's default, need it;
// Cilium's produce role does not include it) and produce to topic
// "allowed" only (apiKey rules, so that a Produce to "denied" reaches
// the proxy), c consume every topic (role consume), and pod d, with
// client ID "good-client" only, do anything.
const kafkaPolicy = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: b-kafka, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: b}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: a}}]
    toPorts:
    - ports: [{port: "9092", protocol: TCP}]
      rules:
        kafka:
        - {apiKey: apiversions}
        - {apiKey: metadata}
        - {apiKey: initproducerid}
        - {apiKey: produce, topic: allowed}
  - fromEndpoints: [{matchLabels: {app: c}}]
    toPorts:
    - ports: [{port: "9092", protocol: TCP}]
      rules:
        kafka: [{role: consume}]
  - fromEndpoints: [{matchLabels: {app: d}}]
    toPorts:
    - ports: [{port: "9092", protocol: TCP}]
      rules:
        kafka: [{clientID: good-client}]
`

// kafkaBroker runs franz-go's fake Kafka cluster (one broker) on p's
// address, port 9092, with the topics "allowed" and "denied".
func kafkaBroker(t *testing.T, p *pod) {
	t.Helper()
	listen := func(network, _ string) (l net.Listener, err error) {
		err = p.ns.Do(func() (err error) {
			l, err = net.Listen(network, netip.AddrPortFrom(p.ip, kafkaPort).String())
			return err
		})
		return l, err
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(kafkaPort), kfake.ListenFn(listen),
		kfake.SeedTopics(1, "allowed", "denied"))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
}

// kafkaClient is a franz-go client in p's netns for b's broker.
func (p *pod) kafkaClient(t *testing.T, b *pod, clientID string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	dial := func(ctx context.Context, network, host string) (c net.Conn, err error) {
		err = p.ns.Do(func() (err error) {
			c, err = (&net.Dialer{}).DialContext(ctx, network, host)
			return err
		})
		return c, err
	}
	opts = append([]kgo.Opt{kgo.SeedBrokers(netip.AddrPortFrom(b.ip, kafkaPort).String()), kgo.Dialer(dial),
		kgo.ClientID(clientID), kgo.RequestRetries(2), kgo.RecordRetries(2), kgo.RetryTimeout(5 * time.Second),
		kgo.RecordDeliveryTimeout(10 * time.Second)}, opts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// produce produces one record to topic and returns its error.
func produce(cl *kgo.Client, topic, value string) error {
	ctx, cancel := context.WithTimeout(context.Background(), okTimeout)
	defer cancel()
	return cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte(value)}).FirstErr()
}

// TestKafka: b runs a Kafka broker (franz-go's kfake) and its ingress
// policy has Kafka rules; franz-go clients in a, c and d reach it
// through the Linux datapath and the proxy's Kafka listener. a
// produces to "allowed"; its Produce to "denied" gets
// TOPIC_AUTHORIZATION_FAILED from the proxy and its client goes on
// producing to "allowed" on the same connection; c (role consume) is
// refused Produce and consumes what a produced; d is served with client
// ID "good-client" only. The denials are l7-access events with the
// Kafka request's fields.
func TestKafka(t *testing.T) {
	n := newNode(t, "10.244.78.0/24", nodeOpts{pods: []string{"a", "b", "c", "d"}})
	a, b, c, d := n.pods["a"], n.pods["b"], n.pods["c"], n.pods["d"]
	kafkaBroker(t, b)
	if err := produce(a.kafkaClient(t, b, "a-client"), "denied", "no policy yet"); err != nil {
		t.Fatalf("produce without policy: %v", err)
	}

	n.importPolicy(kafkaPolicy)
	view := n.l7Acked(b)
	if len(view.ComputedL7) == 0 || len(view.ComputedL7[0].Kafka) == 0 {
		t.Errorf("policy view computed-l7 = %+v, want kafka rules", view.ComputedL7)
	}

	ac := a.kafkaClient(t, b, "a-client")
	if err := produce(ac, "allowed", "one"); err != nil {
		t.Errorf("a produce to allowed: %v", err)
	}
	if err := produce(ac, "denied", "two"); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Errorf("a produce to denied: %v, want TOPIC_AUTHORIZATION_FAILED", err)
	}
	if err := produce(ac, "allowed", "three"); err != nil {
		t.Errorf("a produce to allowed after a denial: %v", err)
	}
	ev, ok := n.waitEvent(func(ev events.Event) bool {
		return ev.Type == events.L7Access && ev.L7 != nil && ev.L7.Kafka != nil && ev.L7.Verdict == "denied" && ev.L7.Kafka.APIKey == "produce"
	})
	if ok && (ev.L7.Protocol != "kafka" || ev.Endpoint != uint16(b.ep.ID) || ev.L7.SrcIdentity != uint32(a.ep.Identity.ID) ||
		ev.L7.Kafka.ClientID != "a-client" || !slices.Equal(ev.L7.Kafka.Topics, []string{"denied"}) || ev.L7.Kafka.ErrorCode != 29) {
		t.Errorf("l7-access event %+v (kafka %+v), want b's ingress denying a's produce to denied", ev.L7, ev.L7.Kafka)
	}

	// Not idempotent: its Produce, not InitProducerId, meets the rules.
	cc := c.kafkaClient(t, b, "c-client", kgo.ConsumeTopics("allowed"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableIdempotentWrite())
	if err := produce(cc, "allowed", "from c"); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Errorf("c (consume role) produce: %v, want TOPIC_AUTHORIZATION_FAILED", err)
	}
	var got []string
	ctx, cancel := context.WithTimeout(context.Background(), okTimeout)
	for len(got) < 2 && ctx.Err() == nil {
		fs := cc.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	cancel()
	if !slices.Equal(got, []string{"one", "three"}) {
		t.Errorf("c consumed %q, want [one three]", got)
	}

	if err := produce(d.kafkaClient(t, b, "good-client"), "denied", "d"); err != nil {
		t.Errorf("d as good-client produce: %v", err)
	}
	if err := produce(d.kafkaClient(t, b, "bad-client", kgo.RequestRetries(0)), "allowed", "d"); err == nil {
		t.Errorf("d as bad-client produced, want a denial")
	}
	n.waitEvent(func(ev events.Event) bool {
		return ev.Type == events.L7Access && ev.L7 != nil && ev.L7.Kafka != nil && ev.L7.Verdict == "denied" && ev.L7.Kafka.ClientID == "bad-client"
	})
}

// TestKafkaRaw: raw Kafka requests from a on one connection: a denied
// Produce gets the proxy's answer with its correlation ID and
// TOPIC_AUTHORIZATION_FAILED, the next request on the connection is
// served by the broker, and an unparsable request closes the
// connection.
func TestKafkaRaw(t *testing.T) {
	n := newNode(t, "10.244.80.0/24", nodeOpts{})
	a, b := n.pods["a"], n.pods["b"]
	kafkaBroker(t, b)
	n.importPolicy(kafkaPolicy)
	n.l7Acked(b)

	var conn net.Conn
	err := a.ns.Do(func() (err error) {
		conn, err = net.DialTimeout("tcp", netip.AddrPortFrom(b.ip, kafkaPort).String(), okTimeout)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(okTimeout))

	pr := kmsg.NewPtrProduceRequest()
	pr.SetVersion(7)
	pr.Acks, pr.TimeoutMillis = 1, 5000
	pt := kmsg.NewProduceRequestTopic()
	pt.Topic = "denied"
	pp := kmsg.NewProduceRequestTopicPartition()
	pt.Partitions = append(pt.Partitions, pp)
	pr.Topics = append(pr.Topics, pt)
	resp := kmsg.NewPtrProduceResponse()
	if corr := rawRequest(t, conn, pr, 4242, resp); corr != 4242 {
		t.Errorf("denied produce answered with correlation ID %d, want 4242", corr)
	}
	if len(resp.Topics) != 1 || resp.Topics[0].Topic != "denied" || len(resp.Topics[0].Partitions) != 1 ||
		resp.Topics[0].Partitions[0].ErrorCode != kerr.TopicAuthorizationFailed.Code {
		t.Errorf("denied produce response %+v, want TOPIC_AUTHORIZATION_FAILED on denied/0", resp.Topics)
	}

	mr := kmsg.NewPtrMetadataRequest()
	mr.SetVersion(4)
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr("allowed")
	mr.Topics = append(mr.Topics, mt)
	mresp := kmsg.NewPtrMetadataResponse()
	if corr := rawRequest(t, conn, mr, 4243, mresp); corr != 4243 {
		t.Errorf("metadata answered with correlation ID %d, want 4243", corr)
	}
	if len(mresp.Brokers) != 1 || len(mresp.Topics) != 1 || mresp.Topics[0].ErrorCode != 0 {
		t.Errorf("metadata after a denial: brokers %+v topics %+v, want the broker's answer", mresp.Brokers, mresp.Topics)
	}

	// Not a Kafka request: a frame of 5 bytes.
	if _, err := conn.Write([]byte{0, 0, 0, 5, 1, 2, 3, 4, 5}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		t.Errorf("after an unparsable request: read %v, want the connection closed", err)
	}
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}

// rawRequest sends req with correlation ID corr and client ID "raw" on
// conn, reads the answer into resp and returns its correlation ID.
func rawRequest(t *testing.T, conn net.Conn, req kmsg.Request, corr int32, resp kmsg.Response) int32 {
	t.Helper()
	b := make([]byte, 4, 128)
	b = binary.BigEndian.AppendUint16(b, uint16(req.Key()))
	b = binary.BigEndian.AppendUint16(b, uint16(req.GetVersion()))
	b = binary.BigEndian.AppendUint32(b, uint32(corr))
	b = binary.BigEndian.AppendUint16(b, 3)
	b = append(b, "raw"...)
	if req.IsFlexible() {
		b = append(b, 0)
	}
	b = req.AppendTo(b)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	if _, err := conn.Write(b); err != nil {
		t.Fatalf("write %s: %v", kmsg.NameForKey(req.Key()), err)
	}
	var hdr [8]byte
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		t.Fatalf("read %s response: %v", kmsg.NameForKey(req.Key()), err)
	}
	body := make([]byte, binary.BigEndian.Uint32(hdr[:])-4)
	if _, err := io.ReadFull(conn, body); err != nil {
		t.Fatalf("read %s response: %v", kmsg.NameForKey(req.Key()), err)
	}
	resp.SetVersion(req.GetVersion())
	if resp.IsFlexible() {
		body = body[1:]
	}
	if err := resp.ReadFrom(body); err != nil {
		t.Fatalf("decode %s response: %v", kmsg.NameForKey(req.Key()), err)
	}
	return int32(binary.BigEndian.Uint32(hdr[4:]))
}
