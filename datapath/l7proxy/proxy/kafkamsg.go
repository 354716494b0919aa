package proxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"reflect"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// maxKafkaFrame bounds one Kafka request or response frame (the proxy
// holds a whole request to decide it). Kafka's own default for
// requests (socket.request.max.bytes) is 100 MiB; a producer's default
// batch is 1 MiB.
const maxKafkaFrame = 32 << 20

// errKafkaRequest wraps every reason a request cannot be parsed: the
// proxy refuses it by closing the connection, as Cilium's does.
var errKafkaRequest = errors.New("unparsable kafka request")

// Error codes of Kafka responses (https://kafka.apache.org/protocol#protocol_error_codes).
const (
	kafkaTopicAuthorizationFailed int16 = 29
)

// Newest versions whose requests name their topics (later ones carry
// topic IDs, which rules cannot match): the proxy lowers a broker's
// ApiVersions answer to them (clampAPIVersions).
var kafkaNamedTopicVersions = map[int16]int16{
	policy.KafkaProduce:      12,
	policy.KafkaFetch:        12,
	policy.KafkaOffsetCommit: 9,
	policy.KafkaOffsetFetch:  9,
}

// kafkaRequest is one parsed request.
type kafkaRequest struct {
	policy.KafkaRequest
	CorrelationID int32
	// body is the parsed request (its version set).
	body kmsg.Request
}

// readKafkaFrame reads one frame (a 4-byte size and that many bytes)
// from r and returns it whole, size included, reusing buf.
func readKafkaFrame(r io.Reader, buf []byte) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := int32(binary.BigEndian.Uint32(hdr[:]))
	if n < 0 || n > maxKafkaFrame {
		return nil, fmt.Errorf("%w: frame size %d not in [0, %d]", errKafkaRequest, n, maxKafkaFrame)
	}
	if cap(buf) < 4+int(n) {
		buf = make([]byte, 4+int(n))
	}
	buf = buf[:4+int(n)]
	copy(buf, hdr[:])
	if _, err := io.ReadFull(r, buf[4:]); err != nil {
		return nil, err
	}
	return buf, nil
}

// parseKafkaRequest parses a request frame (size included): the
// header (API key, version, correlation ID, client ID, and the tagged
// fields of flexible versions) and the body, with franz-go's kmsg
// codecs. Returns an error wrapping errKafkaRequest for an unknown API
// key, a version the codecs do not know, or a malformed frame.
func parseKafkaRequest(frame []byte) (*kafkaRequest, error) {
	if len(frame) < 14 {
		return nil, fmt.Errorf("%w: %d bytes, shorter than a request header", errKafkaRequest, len(frame))
	}
	if int(binary.BigEndian.Uint32(frame)) != len(frame)-4 {
		return nil, fmt.Errorf("%w: frame size does not match its bytes", errKafkaRequest)
	}
	r := &kafkaRequest{}
	r.APIKey = int16(binary.BigEndian.Uint16(frame[4:]))
	r.APIVersion = int16(binary.BigEndian.Uint16(frame[6:]))
	r.CorrelationID = int32(binary.BigEndian.Uint32(frame[8:]))
	off := 14
	switch n := int(int16(binary.BigEndian.Uint16(frame[12:]))); {
	case n == -1: // null client ID
	case n < 0 || off+n > len(frame):
		return nil, fmt.Errorf("%w: client ID length %d", errKafkaRequest, n)
	default:
		r.ClientID = string(frame[off : off+n])
		off += n
	}
	body := kmsg.RequestForKey(r.APIKey)
	if body == nil {
		return nil, fmt.Errorf("%w: unknown API key %d", errKafkaRequest, r.APIKey)
	}
	if r.APIVersion < 0 || r.APIVersion > body.MaxVersion() {
		return nil, fmt.Errorf("%w: %s version %d (this proxy knows 0 to %d)", errKafkaRequest, kmsg.NameForKey(r.APIKey), r.APIVersion, body.MaxVersion())
	}
	body.SetVersion(r.APIVersion)
	if body.IsFlexible() {
		var err error
		if off, err = skipTags(frame, off); err != nil {
			return nil, err
		}
	}
	if err := body.ReadFrom(frame[off:]); err != nil {
		return nil, fmt.Errorf("%w: %s v%d: %w", errKafkaRequest, kmsg.NameForKey(r.APIKey), r.APIVersion, err)
	}
	r.body = body
	r.Topics = kafkaTopics(body)
	return r, nil
}

// skipTags skips the tagged fields at b[off:] (a count, then per field
// a tag, a size and the bytes) and returns the offset after them.
func skipTags(b []byte, off int) (int, error) {
	count, off, err := uvarint(b, off)
	if err != nil {
		return 0, err
	}
	for range count {
		if _, off, err = uvarint(b, off); err != nil {
			return 0, err
		}
		var size uint64
		if size, off, err = uvarint(b, off); err != nil {
			return 0, err
		}
		if size > uint64(len(b)-off) {
			return 0, fmt.Errorf("%w: tagged field of %d bytes past the frame", errKafkaRequest, size)
		}
		off += int(size)
	}
	return off, nil
}

func uvarint(b []byte, off int) (uint64, int, error) {
	if off > len(b) {
		return 0, 0, fmt.Errorf("%w: truncated header", errKafkaRequest)
	}
	v, n := binary.Uvarint(b[off:])
	if n <= 0 || v > maxKafkaFrame {
		return 0, 0, fmt.Errorf("%w: bad varint in the header", errKafkaRequest)
	}
	return v, off + n, nil
}

// kafkaTopics are the topics a request names, for the API keys whose
// topics Cilium's proxy reads: Produce, Fetch, ListOffsets, Metadata,
// OffsetCommit and OffsetFetch. A topic given by ID only (the versions
// kafkaNamedTopicVersions excludes) is "": no topic rule matches it.
func kafkaTopics(body kmsg.Request) []string {
	var out []string
	switch b := body.(type) {
	case *kmsg.ProduceRequest:
		for _, t := range b.Topics {
			out = append(out, t.Topic)
		}
	case *kmsg.FetchRequest:
		for _, t := range b.Topics {
			out = append(out, t.Topic)
		}
	case *kmsg.ListOffsetsRequest:
		for _, t := range b.Topics {
			out = append(out, t.Topic)
		}
	case *kmsg.MetadataRequest:
		for _, t := range b.Topics {
			if t.Topic == nil {
				out = append(out, "")
				continue
			}
			out = append(out, *t.Topic)
		}
	case *kmsg.OffsetCommitRequest:
		for _, t := range b.Topics {
			out = append(out, t.Topic)
		}
	case *kmsg.OffsetFetchRequest:
		for _, t := range b.Topics {
			out = append(out, t.Topic)
		}
		for _, g := range b.Groups {
			for _, t := range g.Topics {
				out = append(out, t.Topic)
			}
		}
	}
	return out
}

// expectsResponse reports whether the broker answers r: a Produce
// request with acks 0 gets no answer.
func (r *kafkaRequest) expectsResponse() bool {
	p, ok := r.body.(*kmsg.ProduceRequest)
	return !ok || p.Acks != 0
}

// denialResponse is the response frame (size included) the proxy
// answers a denied request with, as Cilium's does: the request's
// correlation ID and TOPIC_AUTHORIZATION_FAILED on every topic and
// partition it names (or on the response's own error code for API keys
// without topics). Returns nil when the response has no error code to
// set.
func denialResponse(r *kafkaRequest) []byte {
	resp := r.body.ResponseKind()
	resp.SetVersion(r.APIVersion)
	if !fillDenial(resp, r.body) {
		return nil
	}
	b := make([]byte, 8, 64)
	binary.BigEndian.PutUint32(b[4:], uint32(r.CorrelationID))
	// A flexible response's header has tagged fields, except
	// ApiVersions' (its header is always v0).
	if resp.IsFlexible() && r.APIKey != policy.KafkaAPIVersions {
		b = append(b, 0)
	}
	b = resp.AppendTo(b)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

// fillDenial fills resp, the response to req, with the denial: the
// topics and partitions of req, each with the error code. Reports
// false when resp has nowhere to put it.
func fillDenial(resp kmsg.Response, req kmsg.Request) bool {
	const code = kafkaTopicAuthorizationFailed
	switch rs := resp.(type) {
	case *kmsg.ProduceResponse:
		for _, t := range req.(*kmsg.ProduceRequest).Topics {
			rt := kmsg.NewProduceResponseTopic()
			rt.Topic, rt.TopicID = t.Topic, t.TopicID
			for _, p := range t.Partitions {
				rp := kmsg.NewProduceResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p.Partition, code
				rt.Partitions = append(rt.Partitions, rp)
			}
			rs.Topics = append(rs.Topics, rt)
		}
	case *kmsg.FetchResponse:
		rs.ErrorCode = code
		for _, t := range req.(*kmsg.FetchRequest).Topics {
			rt := kmsg.NewFetchResponseTopic()
			rt.Topic, rt.TopicID = t.Topic, t.TopicID
			for _, p := range t.Partitions {
				rp := kmsg.NewFetchResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p.Partition, code
				rt.Partitions = append(rt.Partitions, rp)
			}
			rs.Topics = append(rs.Topics, rt)
		}
	case *kmsg.ListOffsetsResponse:
		for _, t := range req.(*kmsg.ListOffsetsRequest).Topics {
			rt := kmsg.NewListOffsetsResponseTopic()
			rt.Topic = t.Topic
			for _, p := range t.Partitions {
				rp := kmsg.NewListOffsetsResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p.Partition, code
				rt.Partitions = append(rt.Partitions, rp)
			}
			rs.Topics = append(rs.Topics, rt)
		}
	case *kmsg.MetadataResponse:
		for _, t := range req.(*kmsg.MetadataRequest).Topics {
			rt := kmsg.NewMetadataResponseTopic()
			rt.Topic, rt.TopicID, rt.ErrorCode = t.Topic, t.TopicID, code
			rs.Topics = append(rs.Topics, rt)
		}
	case *kmsg.OffsetCommitResponse:
		for _, t := range req.(*kmsg.OffsetCommitRequest).Topics {
			rt := kmsg.NewOffsetCommitResponseTopic()
			rt.Topic, rt.TopicID = t.Topic, t.TopicID
			for _, p := range t.Partitions {
				rp := kmsg.NewOffsetCommitResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p.Partition, code
				rt.Partitions = append(rt.Partitions, rp)
			}
			rs.Topics = append(rs.Topics, rt)
		}
	case *kmsg.OffsetFetchResponse:
		rq := req.(*kmsg.OffsetFetchRequest)
		rs.ErrorCode = code
		for _, t := range rq.Topics {
			rt := kmsg.NewOffsetFetchResponseTopic()
			rt.Topic = t.Topic
			for _, p := range t.Partitions {
				rp := kmsg.NewOffsetFetchResponseTopicPartition()
				rp.Partition, rp.ErrorCode, rp.Offset = p, code, -1
				rt.Partitions = append(rt.Partitions, rp)
			}
			rs.Topics = append(rs.Topics, rt)
		}
		for _, g := range rq.Groups {
			rg := kmsg.NewOffsetFetchResponseGroup()
			rg.Group, rg.ErrorCode = g.Group, code
			rs.Groups = append(rs.Groups, rg)
		}
	default:
		// Other API keys: the response's top-level error code, when it
		// has one (JoinGroup, Heartbeat, FindCoordinator's older
		// versions, ...).
		f := reflect.ValueOf(resp).Elem().FieldByName("ErrorCode")
		if !f.IsValid() || f.Kind() != reflect.Int16 {
			return false
		}
		f.SetInt(int64(code))
		if fc, ok := resp.(*kmsg.FindCoordinatorResponse); ok {
			for _, k := range req.(*kmsg.FindCoordinatorRequest).CoordinatorKeys {
				c := kmsg.NewFindCoordinatorResponseCoordinator()
				c.Key, c.ErrorCode = k, code
				fc.Coordinators = append(fc.Coordinators, c)
			}
		}
	}
	return true
}

// clampAPIVersions lowers, in a broker's ApiVersions response frame
// (size included) to a request of version v, the newest version of
// each API key to kafkaNamedTopicVersions, so that clients name their
// topics. A frame it cannot parse is returned unchanged.
func clampAPIVersions(frame []byte, v int16) []byte {
	if len(frame) < 8 {
		return frame
	}
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.SetVersion(v)
	if err := resp.ReadFrom(frame[8:]); err != nil {
		return frame
	}
	changed := false
	for i := range resp.ApiKeys {
		k := &resp.ApiKeys[i]
		if max, ok := kafkaNamedTopicVersions[k.ApiKey]; ok && k.MaxVersion > max {
			k.MaxVersion, changed = max, true
		}
	}
	if !changed {
		return frame
	}
	out := resp.AppendTo(append([]byte(nil), frame[:8]...))
	binary.BigEndian.PutUint32(out, uint32(len(out)-4))
	return out
}
