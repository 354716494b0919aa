package proxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/membrane-cni/membrane/datapath/l7proxy"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// kafkaFrame encodes req as a client does: size, API key, version,
// correlation ID, client ID (nil: null), the header's tagged fields
// when flexible, the body.
func kafkaFrame(req kmsg.Request, corr int32, clientID *string) []byte {
	b := make([]byte, 4, 128)
	b = binary.BigEndian.AppendUint16(b, uint16(req.Key()))
	b = binary.BigEndian.AppendUint16(b, uint16(req.GetVersion()))
	b = binary.BigEndian.AppendUint32(b, uint32(corr))
	if clientID == nil {
		b = binary.BigEndian.AppendUint16(b, 0xffff)
	} else {
		b = binary.BigEndian.AppendUint16(b, uint16(len(*clientID)))
		b = append(b, *clientID...)
	}
	if req.IsFlexible() {
		b = append(b, 0)
	}
	b = req.AppendTo(b)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

func produceReq(v int16, acks int16, topics ...string) *kmsg.ProduceRequest {
	r := kmsg.NewPtrProduceRequest()
	r.SetVersion(v)
	r.Acks = acks
	for _, t := range topics {
		rt := kmsg.NewProduceRequestTopic()
		rt.Topic = t
		rt.Partitions = []kmsg.ProduceRequestTopicPartition{kmsg.NewProduceRequestTopicPartition()}
		r.Topics = append(r.Topics, rt)
	}
	return r
}

func fetchReq(v int16, topics ...string) *kmsg.FetchRequest {
	r := kmsg.NewPtrFetchRequest()
	r.SetVersion(v)
	for _, t := range topics {
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic = t
		p := kmsg.NewFetchRequestTopicPartition()
		p.Partition = 3
		rt.Partitions = []kmsg.FetchRequestTopicPartition{p}
		r.Topics = append(r.Topics, rt)
	}
	return r
}

func metadataReq(v int16, topics ...string) *kmsg.MetadataRequest {
	r := kmsg.NewPtrMetadataRequest()
	r.SetVersion(v)
	for _, t := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		r.Topics = append(r.Topics, rt)
	}
	return r
}

func offsetFetchReq(v int16, group string, topics ...string) *kmsg.OffsetFetchRequest {
	r := kmsg.NewPtrOffsetFetchRequest()
	r.SetVersion(v)
	if v >= 8 {
		g := kmsg.NewOffsetFetchRequestGroup()
		g.Group = group
		for _, t := range topics {
			gt := kmsg.NewOffsetFetchRequestGroupTopic()
			gt.Topic, gt.Partitions = t, []int32{0}
			g.Topics = append(g.Topics, gt)
		}
		r.Groups = append(r.Groups, g)
		return r
	}
	r.Group = group
	for _, t := range topics {
		rt := kmsg.NewOffsetFetchRequestTopic()
		rt.Topic, rt.Partitions = t, []int32{0}
		r.Topics = append(r.Topics, rt)
	}
	return r
}

func versioned[R kmsg.Request](r R, v int16) R {
	r.SetVersion(v)
	return r
}

// kafkaSeeds are requests of the API keys and versions the proxy reads
// topics of (flexible and not), for the parser tests and the fuzzer.
func kafkaSeeds() []struct {
	req    kmsg.Request
	topics []string
} {
	listOffsets := kmsg.NewPtrListOffsetsRequest()
	listOffsets.SetVersion(5)
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = "l1"
	lt.Partitions = []kmsg.ListOffsetsRequestTopicPartition{kmsg.NewListOffsetsRequestTopicPartition()}
	listOffsets.Topics = append(listOffsets.Topics, lt)
	commit := kmsg.NewPtrOffsetCommitRequest()
	commit.SetVersion(8)
	ct := kmsg.NewOffsetCommitRequestTopic()
	ct.Topic = "c1"
	ct.Partitions = []kmsg.OffsetCommitRequestTopicPartition{kmsg.NewOffsetCommitRequestTopicPartition()}
	commit.Topics = append(commit.Topics, ct)
	return []struct {
		req    kmsg.Request
		topics []string
	}{
		{produceReq(3, 1, "t1"), []string{"t1"}},
		{produceReq(9, -1, "t1", "t2"), []string{"t1", "t2"}},
		{produceReq(12, 1, "t3"), []string{"t3"}},
		{fetchReq(4, "f1"), []string{"f1"}},
		{fetchReq(12, "f1", "f2"), []string{"f1", "f2"}},
		{metadataReq(1, "m1"), []string{"m1"}},
		{metadataReq(12, "m1", "m2"), []string{"m1", "m2"}},
		{versioned(kmsg.NewPtrMetadataRequest(), 4), nil},
		{listOffsets, []string{"l1"}},
		{commit, []string{"c1"}},
		{offsetFetchReq(7, "g", "o1"), []string{"o1"}},
		{offsetFetchReq(8, "g", "o1", "o2"), []string{"o1", "o2"}},
		{versioned(kmsg.NewPtrApiVersionsRequest(), 3), nil},
		{versioned(kmsg.NewPtrHeartbeatRequest(), 4), nil},
		{versioned(kmsg.NewPtrJoinGroupRequest(), 5), nil},
	}
}

// TestParseKafkaRequest: the header's fields and the topics of each
// seed request, flexible versions included.
func TestParseKafkaRequest(t *testing.T) {
	client := "client-1"
	for i, s := range kafkaSeeds() {
		r, err := parseKafkaRequest(kafkaFrame(s.req, int32(100+i), &client))
		if err != nil {
			t.Errorf("%s v%d: %v", kmsg.NameForKey(s.req.Key()), s.req.GetVersion(), err)
			continue
		}
		if r.APIKey != s.req.Key() || r.APIVersion != s.req.GetVersion() || r.CorrelationID != int32(100+i) || r.ClientID != client ||
			!slices.Equal(r.Topics, s.topics) {
			t.Errorf("%s v%d: parsed %+v (correlation %d), want topics %q", kmsg.NameForKey(s.req.Key()), s.req.GetVersion(), r.KafkaRequest, r.CorrelationID, s.topics)
		}
	}
	r, err := parseKafkaRequest(kafkaFrame(produceReq(7, 1, "t"), 1, nil))
	if err != nil || r.ClientID != "" {
		t.Errorf("null client ID: %+v %v", r, err)
	}
	good := kafkaFrame(produceReq(7, 1, "t"), 1, &client)
	bad := map[string][]byte{
		"short":         good[:10],
		"size mismatch": append(slices.Clone(good), 0),
		"truncated body": func() []byte {
			b := slices.Clone(good[:len(good)-3])
			binary.BigEndian.PutUint32(b, uint32(len(b)-4))
			return b
		}(),
		"unknown key":     func() []byte { b := slices.Clone(good); binary.BigEndian.PutUint16(b[4:], 999); return b }(),
		"version too new": func() []byte { b := slices.Clone(good); binary.BigEndian.PutUint16(b[6:], 99); return b }(),
		"client ID past":  func() []byte { b := slices.Clone(good); binary.BigEndian.PutUint16(b[12:], 5000); return b }(),
	}
	for name, b := range bad {
		if _, err := parseKafkaRequest(b); !errors.Is(err, errKafkaRequest) {
			t.Errorf("%s: err = %v, want errKafkaRequest", name, err)
		}
	}
}

// TestReadKafkaFrame: frames are read whole; a size beyond the bound
// is refused before reading it.
func TestReadKafkaFrame(t *testing.T) {
	f := kafkaFrame(produceReq(7, 1, "t"), 9, nil)
	got, err := readKafkaFrame(bytes.NewReader(append(slices.Clone(f), f...)), nil)
	if err != nil || !bytes.Equal(got, f) {
		t.Errorf("readKafkaFrame = %x %v, want %x", got, err, f)
	}
	if _, err := readKafkaFrame(bytes.NewReader([]byte{0x7f, 0, 0, 0}), nil); !errors.Is(err, errKafkaRequest) {
		t.Errorf("huge frame: %v, want errKafkaRequest", err)
	}
}

// TestDenialResponse: the proxy's answer to a denied request decodes
// as the request's response, with its correlation ID and
// TOPIC_AUTHORIZATION_FAILED on every topic and partition (or the
// response's own error code).
func TestDenialResponse(t *testing.T) {
	for i, s := range kafkaSeeds() {
		name := kmsg.NameForKey(s.req.Key())
		r, err := parseKafkaRequest(kafkaFrame(s.req, int32(7+i), nil))
		if err != nil {
			t.Fatal(err)
		}
		b := denialResponse(r)
		if b == nil {
			t.Errorf("%s v%d: no denial", name, s.req.GetVersion())
			continue
		}
		if int(binary.BigEndian.Uint32(b)) != len(b)-4 || int32(binary.BigEndian.Uint32(b[4:])) != int32(7+i) {
			t.Errorf("%s v%d: size or correlation ID wrong in %x", name, s.req.GetVersion(), b[:8])
			continue
		}
		resp := s.req.ResponseKind()
		resp.SetVersion(s.req.GetVersion())
		body := b[8:]
		if resp.IsFlexible() && s.req.Key() != policy.KafkaAPIVersions {
			body = body[1:]
		}
		if err := resp.ReadFrom(body); err != nil {
			t.Errorf("%s v%d: decode the denial: %v", name, s.req.GetVersion(), err)
			continue
		}
		if codes := errorCodes(resp); len(codes) == 0 || slices.ContainsFunc(codes, func(c int16) bool { return c != kafkaTopicAuthorizationFailed }) {
			t.Errorf("%s v%d: error codes %v, want 29 everywhere", name, s.req.GetVersion(), codes)
		}
	}
}

// errorCodes are the error codes a denial sets (per topic and
// partition where the response has them).
func errorCodes(resp kmsg.Response) []int16 {
	var out []int16
	switch r := resp.(type) {
	case *kmsg.ProduceResponse:
		for _, t := range r.Topics {
			for _, p := range t.Partitions {
				out = append(out, p.ErrorCode)
			}
		}
	case *kmsg.FetchResponse:
		for _, t := range r.Topics {
			for _, p := range t.Partitions {
				out = append(out, p.ErrorCode)
			}
		}
	case *kmsg.MetadataResponse:
		for _, t := range r.Topics {
			out = append(out, t.ErrorCode)
		}
		if len(r.Topics) == 0 {
			out = append(out, kafkaTopicAuthorizationFailed) // all topics: nothing to name
		}
	case *kmsg.ListOffsetsResponse:
		for _, t := range r.Topics {
			for _, p := range t.Partitions {
				out = append(out, p.ErrorCode)
			}
		}
	case *kmsg.OffsetCommitResponse:
		for _, t := range r.Topics {
			for _, p := range t.Partitions {
				out = append(out, p.ErrorCode)
			}
		}
	case *kmsg.OffsetFetchResponse:
		for _, t := range r.Topics {
			for _, p := range t.Partitions {
				out = append(out, p.ErrorCode)
			}
		}
		for _, g := range r.Groups {
			out = append(out, g.ErrorCode)
		}
	case *kmsg.ApiVersionsResponse:
		out = append(out, r.ErrorCode)
	case *kmsg.HeartbeatResponse:
		out = append(out, r.ErrorCode)
	case *kmsg.JoinGroupResponse:
		out = append(out, r.ErrorCode)
	}
	return out
}

// TestClampAPIVersions: a broker's ApiVersions answer is lowered to the
// versions that name topics; other keys keep theirs.
func TestClampAPIVersions(t *testing.T) {
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.SetVersion(3)
	for _, k := range [][3]int16{{0, 3, 13}, {1, 4, 18}, {3, 0, 13}, {8, 2, 10}, {9, 1, 10}} {
		ak := kmsg.NewApiVersionsResponseApiKey()
		ak.ApiKey, ak.MinVersion, ak.MaxVersion = k[0], k[1], k[2]
		resp.ApiKeys = append(resp.ApiKeys, ak)
	}
	frame := resp.AppendTo([]byte{0, 0, 0, 0, 0, 0, 0, 42})
	binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))
	out := clampAPIVersions(frame, 3)
	got := kmsg.NewPtrApiVersionsResponse()
	got.SetVersion(3)
	if int(binary.BigEndian.Uint32(out)) != len(out)-4 || binary.BigEndian.Uint32(out[4:]) != 42 {
		t.Fatalf("clamped frame header %x", out[:8])
	}
	if err := got.ReadFrom(out[8:]); err != nil {
		t.Fatal(err)
	}
	want := map[int16]int16{0: 12, 1: 12, 3: 13, 8: 9, 9: 9}
	for _, k := range got.ApiKeys {
		if k.MaxVersion != want[k.ApiKey] {
			t.Errorf("api key %d: max version %d, want %d", k.ApiKey, k.MaxVersion, want[k.ApiKey])
		}
	}
	if junk := []byte{0, 0, 0, 5, 0, 0, 0, 1, 9}; !bytes.Equal(clampAPIVersions(junk, 3), junk) {
		t.Error("an unparsable answer must pass unchanged")
	}
}

// TestKafkaVerdict: both sides' Kafka rules must allow; an HTTP rule
// on the key of the other side denies (the connection reached the
// Kafka listener), and the HTTP proxy denies a key with Kafka rules.
func TestKafkaVerdict(t *testing.T) {
	a, b, c := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.4"), netip.MustParseAddr("10.0.1.3")
	egress := &l7proxy.EndpointPolicy{ID: 1, IPs: []netip.Addr{a}, L7: []policy.L7Entry{
		{Key: policy.Key{Identity: idB, Port: 9092, Proto: policy.ProtoTCP, Dir: policy.Egress}, Kafka: []policy.KafkaRule{{ClientID: "a"}}},
		{Key: policy.Key{Identity: idC, Port: 9092, Proto: policy.ProtoTCP, Dir: policy.Egress}, HTTP: []policy.HTTPRule{{}}}}}
	ingress := &l7proxy.EndpointPolicy{ID: 2, IPs: []netip.Addr{b}, L7: []policy.L7Entry{
		{Key: policy.Key{Port: 9092, Proto: policy.ProtoTCP, Dir: policy.Ingress}, Kafka: []policy.KafkaRule{{Role: "produce", Topic: "t1"}}}}}
	st := &state{byIP: map[netip.Addr]*compiledEndpoint{},
		ipcache: ipcacheOf(map[netip.Prefix]identity.NumericIdentity{
			netip.MustParsePrefix("10.0.0.2/32"): idA, netip.MustParsePrefix("10.0.0.4/32"): idB, netip.MustParsePrefix("10.0.1.0/24"): idC})}
	for _, ep := range []*l7proxy.EndpointPolicy{egress, ingress} {
		ce, err := compileEndpoint(ep, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, ip := range ep.IPs {
			st.byIP[ip] = ce
		}
	}
	produce := func(client, topic string) *policy.KafkaRequest {
		return &policy.KafkaRequest{APIKey: policy.KafkaProduce, ClientID: client, Topics: []string{topic}}
	}
	tests := []struct {
		name     string
		src, dst netip.Addr
		req      *policy.KafkaRequest
		want     bool
	}{
		{"both allow", a, b, produce("a", "t1"), true},
		{"egress denies the client ID", a, b, produce("x", "t1"), false},
		{"ingress denies the topic", a, b, produce("a", "t2"), false},
		{"ingress only", c, b, produce("x", "t1"), true},
		{"egress HTTP rules on the key", a, c, produce("a", "t1"), false},
		{"not redirected", c, a, produce("a", "t1"), false},
	}
	for _, tt := range tests {
		if d := st.kafkaVerdict(tt.src, tt.dst, 9092, tt.req); d.allowed != tt.want {
			t.Errorf("%s: verdict = %v (%s), want %v", tt.name, d.allowed, d.reason, tt.want)
		}
	}
	r := httptest.NewRequest("GET", "http://x/", nil)
	r.Header = http.Header{}
	if d := st.verdict(c, b, 9092, r); d.allowed {
		t.Error("an HTTP request on a key with Kafka rules: allowed, want denied")
	}
}

// FuzzParseKafkaRequest: any bytes parse or fail with errKafkaRequest,
// never panic; a parsed request's denial is a well-formed frame with
// its correlation ID. Seeds: testdata/fuzz and kafkaSeeds.
func FuzzParseKafkaRequest(f *testing.F) {
	client := "fuzz"
	for _, s := range kafkaSeeds() {
		f.Add(kafkaFrame(s.req, 5, &client))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseKafkaRequest(b)
		if err != nil {
			if !errors.Is(err, errKafkaRequest) {
				t.Fatalf("error %v does not wrap errKafkaRequest", err)
			}
			return
		}
		if d := denialResponse(r); d != nil {
			if len(d) < 8 || int(binary.BigEndian.Uint32(d)) != len(d)-4 || int32(binary.BigEndian.Uint32(d[4:])) != r.CorrelationID {
				t.Fatalf("denial %x of %+v malformed", d, r.KafkaRequest)
			}
		}
		_ = r.expectsResponse()
	})
}
