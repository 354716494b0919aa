package policy

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// KafkaRule is one entry of a port rule's rules.kafka[], as Cilium's
// PortRuleKafka: every field given must match (an empty rule matches
// every request). Role ("produce" or "consume", any case) expands into
// the API keys of that operation; APIKey names one API key (any case,
// Cilium's names: "produce", "fetch", "metadata", ...); the two exclude
// each other. APIVersion is a number the request's API version must
// equal; ClientID must equal the request header's client ID. Topic is
// a topic the request may name: a request naming several topics is
// allowed only when rules together allow all of them, and a topic rule
// never matches a request of a topic-bearing API key that names none.
type KafkaRule struct {
	Role       string `json:"role,omitempty"`
	APIKey     string `json:"apiKey,omitempty"`
	APIVersion string `json:"apiVersion,omitempty"`
	ClientID   string `json:"clientID,omitempty"`
	Topic      string `json:"topic,omitempty"`
}

// Kafka roles (KafkaRule.Role).
const (
	KafkaRoleProduce = "produce"
	KafkaRoleConsume = "consume"
)

// Kafka API keys the rules and the proxy name
// (https://kafka.apache.org/protocol#protocol_api_keys).
const (
	KafkaProduce         int16 = 0
	KafkaFetch           int16 = 1
	KafkaListOffsets     int16 = 2
	KafkaMetadata        int16 = 3
	KafkaOffsetCommit    int16 = 8
	KafkaOffsetFetch     int16 = 9
	KafkaFindCoordinator int16 = 10
	KafkaJoinGroup       int16 = 11
	KafkaHeartbeat       int16 = 12
	KafkaLeaveGroup      int16 = 13
	KafkaSyncGroup       int16 = 14
	KafkaAPIVersions     int16 = 18
)

// kafkaAPIKeys are the names KafkaRule.APIKey accepts: Cilium's list
// (its KafkaAPIKeyMap), keys 0 to 33.
var kafkaAPIKeys = map[string]int16{
	"produce": 0, "fetch": 1, "offsets": 2, "metadata": 3, "leaderandisr": 4, "stopreplica": 5,
	"updatemetadata": 6, "controlledshutdown": 7, "offsetcommit": 8, "offsetfetch": 9,
	"findcoordinator": 10, "joingroup": 11, "heartbeat": 12, "leavegroup": 13, "syncgroup": 14,
	"describegroups": 15, "listgroups": 16, "saslhandshake": 17, "apiversions": 18,
	"createtopics": 19, "deletetopics": 20, "deleterecords": 21, "initproducerid": 22,
	"offsetforleaderepoch": 23, "addpartitionstotxn": 24, "addoffsetstotxn": 25, "endtxn": 26,
	"writetxnmarkers": 27, "txnoffsetcommit": 28, "describeacls": 29, "createacls": 30,
	"deleteacls": 31, "describeconfigs": 32, "alterconfigs": 33,
}

// KafkaAPIKeyName is Cilium's name of API key k (its number when it has
// none).
func KafkaAPIKeyName(k int16) string {
	for name, v := range kafkaAPIKeys {
		if v == k {
			return name
		}
	}
	return strconv.Itoa(int(k))
}

// kafkaRoles are the API keys each role expands into, Cilium's.
var kafkaRoles = map[string][]int16{
	KafkaRoleProduce: {KafkaProduce, KafkaMetadata, KafkaAPIVersions},
	KafkaRoleConsume: {KafkaFetch, KafkaListOffsets, KafkaMetadata, KafkaOffsetCommit, KafkaOffsetFetch,
		KafkaFindCoordinator, KafkaJoinGroup, KafkaHeartbeat, KafkaLeaveGroup, KafkaSyncGroup, KafkaAPIVersions},
}

// KafkaTopicAPIKey reports whether requests of API key k carry topics
// (Cilium's isTopicAPIKey): a rule with a topic matches such a request
// only through the topics it names.
func KafkaTopicAPIKey(k int16) bool {
	switch k {
	case 0, 1, 2, 3, 4, 5, 6, 8, 9, 19, 20, 21, 23, 24, 27, 28, 34, 35, 37:
		return true
	}
	return false
}

// Bounds of Kafka rules: a topic's length (Cilium's, the longest older
// Kafka versions allowed), a client ID's and the rules of one port rule.
const (
	maxKafkaTopic    = 255
	maxKafkaClientID = 1024
	maxKafkaRules    = 256
)

// kafkaTopicChars are the characters of a topic name (Kafka's).
var kafkaTopicChars = regexp.MustCompile(`^[a-zA-Z0-9._-]+$`)

// CompiledKafkaRule is a KafkaRule with its role or API key expanded.
type CompiledKafkaRule struct {
	Rule KafkaRule
	// keys are the allowed API keys (nil: any); version the API version
	// (-1: any).
	keys    []int16
	version int16
}

// CompileKafkaRule validates r as Cilium's PortRuleKafka.Sanitize does;
// an error names the field below path.
func CompileKafkaRule(r KafkaRule, path string) (*CompiledKafkaRule, error) {
	c := &CompiledKafkaRule{Rule: r, version: -1}
	if r.Role != "" && r.APIKey != "" {
		return nil, fmt.Errorf("%s: role %q and apiKey %q together: give one", path, r.Role, r.APIKey)
	}
	if r.APIKey != "" {
		k, ok := kafkaAPIKeys[strings.ToLower(r.APIKey)]
		if !ok {
			return nil, fmt.Errorf("%s.apiKey: unknown Kafka API key %q", path, r.APIKey)
		}
		c.keys = []int16{k}
	}
	if r.Role != "" {
		keys, ok := kafkaRoles[strings.ToLower(r.Role)]
		if !ok {
			return nil, fmt.Errorf("%s.role: %q: want produce or consume", path, r.Role)
		}
		c.keys = keys
	}
	if r.APIVersion != "" {
		v, err := strconv.ParseInt(r.APIVersion, 10, 16)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("%s.apiVersion: %q is not a number from 0 to 32767", path, r.APIVersion)
		}
		c.version = int16(v)
	}
	if len(r.ClientID) > maxKafkaClientID {
		return nil, fmt.Errorf("%s.clientID: longer than %d bytes", path, maxKafkaClientID)
	}
	if r.Topic != "" && (len(r.Topic) > maxKafkaTopic || !kafkaTopicChars.MatchString(r.Topic)) {
		return nil, fmt.Errorf("%s.topic: %q is not a Kafka topic name (at most %d of a-z, A-Z, 0-9, '.', '_', '-')", path, r.Topic, maxKafkaTopic)
	}
	return c, nil
}

// KafkaRequest is what the rules see of one Kafka request.
type KafkaRequest struct {
	APIKey, APIVersion int16
	ClientID           string
	// Topics are the topics the request names (none for API keys the
	// proxy does not read topics of).
	Topics []string
}

// matchesHeader reports whether the request's API key, version and
// client ID satisfy c.
func (c *CompiledKafkaRule) matchesHeader(r *KafkaRequest) bool {
	return (c.keys == nil || slices.Contains(c.keys, r.APIKey)) &&
		(c.version < 0 || c.version == r.APIVersion) &&
		(c.Rule.ClientID == "" || c.Rule.ClientID == r.ClientID)
}

// KafkaAllowed reports whether rules allow r, as Cilium's proxy
// decides: a rule without a topic (or a request of an API key without
// topics) allows the request when its other fields match; a rule with a
// topic covers that topic of the request, and the request is allowed
// once rules cover every topic it names. A request of a topic-bearing
// API key naming no topic (Metadata for all topics) is allowed only by
// a rule without a topic.
func KafkaAllowed(rules []*CompiledKafkaRule, r *KafkaRequest) bool {
	var pending map[string]bool
	for _, c := range rules {
		if !c.matchesHeader(r) {
			continue
		}
		if c.Rule.Topic == "" || !KafkaTopicAPIKey(r.APIKey) {
			return true
		}
		if pending == nil {
			pending = make(map[string]bool, len(r.Topics))
			for _, t := range r.Topics {
				pending[t] = true
			}
		}
		if pending[c.Rule.Topic] {
			delete(pending, c.Rule.Topic)
			if len(pending) == 0 {
				return true
			}
		}
	}
	return false
}

// compileKafkaRules validates rules.kafka[]; an empty list allows every
// request, through the proxy.
func compileKafkaRules(r *l7Rules, path string) ([]KafkaRule, error) {
	if r.HTTP != nil || r.DNS != nil {
		return nil, fmt.Errorf("%s: kafka with http or dns in one port rule: give one L7 protocol", path)
	}
	if len(r.Kafka) > maxKafkaRules {
		return nil, fmt.Errorf("%s.kafka: %d rules, more than %d", path, len(r.Kafka), maxKafkaRules)
	}
	out := make([]KafkaRule, 0, max(len(r.Kafka), 1))
	for i, k := range r.Kafka {
		if _, err := CompileKafkaRule(k, fmt.Sprintf("%s.kafka[%d]", path, i)); err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	if len(out) == 0 {
		out = append(out, KafkaRule{})
	}
	return out, nil
}

func compareKafkaRule(a, b KafkaRule) int {
	return cmp.Or(cmp.Compare(a.Role, b.Role), cmp.Compare(a.APIKey, b.APIKey), cmp.Compare(a.APIVersion, b.APIVersion),
		cmp.Compare(a.ClientID, b.ClientID), cmp.Compare(a.Topic, b.Topic))
}
