package policy

import (
	"slices"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

const kafkaPolicy = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: kafka}
spec:
  endpointSelector: {matchLabels: {app: b}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: a}}]
    toPorts:
    - ports: [{port: "9092", protocol: TCP}]
      rules:
        kafka:
        - {role: Produce, topic: t1}
        - {apiKey: fetch, apiVersion: "11", clientID: c1}
`

// TestKafkaMapState: rules.kafka redirects its key to the Kafka parser
// with the rules; an L4 rule on the key allows every request; HTTP
// rules of another policy on the same key leave the entry with no
// rules (no request passes), and both policies in membrane.io's kinds
// parse as in cilium.io's.
func TestKafkaMapState(t *testing.T) {
	r := NewRepository()
	const a, b identity.NumericIdentity = 300, 301
	r.UpsertIdentity(a, podLabels(t, "default", "app=a"))
	r.UpsertIdentity(b, podLabels(t, "default", "app=b"))
	r.Import(mustParse(t, kafkaPolicy))
	m := r.MapState(b)
	k := Key{a, 9092, ProtoTCP, Ingress}
	if !m.Redirected(k) || len(m.L7) != 1 || m.L7[0].Parser() != ParserKafka || len(m.L7[0].Kafka) != 2 || m.L7[0].HTTP != nil {
		t.Fatalf("L7 = %+v, want one kafka entry with 2 rules", m.L7)
	}
	ports, err := m.Redirects(ProxyPorts{ParserHTTP: 15001, ParserKafka: 15002})
	if err != nil || ports[k] != 15002 {
		t.Errorf("redirects = %v %v, want %v to the kafka port", ports, err, k)
	}
	if _, err := m.Redirects(ProxyPorts{ParserHTTP: 15001}); err == nil {
		t.Error("redirects without a kafka port: want ErrNoProxy")
	}

	r.Import(mustParse(t, strings.Replace(kafkaPolicy, "name: kafka", "name: l4", 1)+"    - ports: [{port: \"9092\", protocol: TCP}]\n"))
	if m := r.MapState(b); len(m.L7) != 1 || !slices.Equal(m.L7[0].Kafka, []KafkaRule{{}}) {
		t.Errorf("L4 rule on a kafka port: L7 = %+v, want one allow-all kafka rule", m.L7)
	}
	if _, err := r.DeleteByName("default/l4"); err != nil {
		t.Fatal(err)
	}

	http := strings.NewReplacer("name: kafka", "name: http", "kafka:\n        - {role: Produce, topic: t1}\n        - {apiKey: fetch, apiVersion: \"11\", clientID: c1}", "http: [{method: GET}]").Replace(kafkaPolicy)
	r.Import(mustParse(t, http))
	if m := r.MapState(b); len(m.L7) != 1 || m.L7[0].HTTP != nil || m.L7[0].Kafka != nil || m.L7[0].Parser() != ParserHTTP {
		t.Errorf("kafka and http on one key: L7 = %+v, want an entry without rules", m.L7)
	}

	mem := strings.NewReplacer("cilium.io/v2", "membrane.io/v2", "CiliumNetworkPolicy", "MembraneNetworkPolicy").Replace(kafkaPolicy)
	ps, err := Parse([]byte(mem))
	if err != nil || len(ps) != 1 || len(ps[0].Rules) != 1 || len(ps[0].Rules[0].Ingress) != 1 || len(ps[0].Rules[0].Ingress[0].Kafka) != 2 {
		t.Errorf("membrane.io kind: %+v %v, want the kafka rules", ps, err)
	}
}

// TestKafkaAllowed: Cilium's matching of a request against a port's
// Kafka rules.
func TestKafkaAllowed(t *testing.T) {
	compile := func(rs ...KafkaRule) []*CompiledKafkaRule {
		var out []*CompiledKafkaRule
		for _, r := range rs {
			c, err := CompileKafkaRule(r, "r")
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, c)
		}
		return out
	}
	produce := func(topics ...string) *KafkaRequest {
		return &KafkaRequest{APIKey: KafkaProduce, APIVersion: 7, ClientID: "c1", Topics: topics}
	}
	cases := []struct {
		name  string
		rules []KafkaRule
		req   *KafkaRequest
		want  bool
	}{
		{"empty rule", []KafkaRule{{}}, produce("x"), true},
		{"no rules", nil, produce("x"), false},
		{"role produce, topic", []KafkaRule{{Role: "produce", Topic: "t1"}}, produce("t1"), true},
		{"role case", []KafkaRule{{Role: "PRODUCE", Topic: "t1"}}, produce("t1"), true},
		{"role produce, other topic", []KafkaRule{{Role: "produce", Topic: "t1"}}, produce("t2"), false},
		{"role produce, metadata", []KafkaRule{{Role: "produce"}}, &KafkaRequest{APIKey: KafkaMetadata, Topics: []string{"x"}}, true},
		{"role produce, apiversions with topic rule", []KafkaRule{{Role: "produce", Topic: "t1"}}, &KafkaRequest{APIKey: KafkaAPIVersions}, true},
		{"role produce, fetch", []KafkaRule{{Role: "produce"}}, &KafkaRequest{APIKey: KafkaFetch, Topics: []string{"t1"}}, false},
		{"role produce, initproducerid", []KafkaRule{{Role: "produce"}}, &KafkaRequest{APIKey: 22}, false},
		{"role consume, fetch", []KafkaRule{{Role: "consume", Topic: "t1"}}, &KafkaRequest{APIKey: KafkaFetch, Topics: []string{"t1"}}, true},
		{"role consume, heartbeat", []KafkaRule{{Role: "consume", Topic: "t1"}}, &KafkaRequest{APIKey: KafkaHeartbeat}, true},
		{"role consume, produce", []KafkaRule{{Role: "consume"}}, produce("t1"), false},
		{"two topics, one rule", []KafkaRule{{Role: "produce", Topic: "t1"}}, produce("t1", "t2"), false},
		{"two topics, two rules", []KafkaRule{{Role: "produce", Topic: "t1"}, {APIKey: "produce", Topic: "t2"}}, produce("t1", "t2"), true},
		{"topic rule, no topics", []KafkaRule{{Topic: "t1"}}, &KafkaRequest{APIKey: KafkaMetadata}, false},
		{"topic rule, unnamed topic", []KafkaRule{{Topic: "t1"}}, produce(""), false},
		{"apiKey", []KafkaRule{{APIKey: "Produce"}}, produce("x"), true},
		{"apiKey other", []KafkaRule{{APIKey: "fetch"}}, produce("x"), false},
		{"apiVersion", []KafkaRule{{APIVersion: "7"}}, produce("x"), true},
		{"apiVersion other", []KafkaRule{{APIVersion: "8"}}, produce("x"), false},
		{"clientID", []KafkaRule{{ClientID: "c1"}}, produce("x"), true},
		{"clientID other", []KafkaRule{{ClientID: "c2"}}, produce("x"), false},
		{"clientID, topic from another rule", []KafkaRule{{ClientID: "c2", Topic: "t1"}, {Topic: "t2"}}, produce("t1", "t2"), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := KafkaAllowed(compile(c.rules...), c.req); got != c.want {
				t.Errorf("KafkaAllowed(%+v, %+v) = %v, want %v", c.rules, c.req, got, c.want)
			}
		})
	}
}
