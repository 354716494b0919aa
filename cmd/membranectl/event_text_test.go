package main

import (
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/events"
)

func TestEventText(t *testing.T) {
	tests := []struct {
		name string
		ev   events.Event
		want string
	}{
		{"drop-v4", events.Event{Type: events.DatapathDrop, Endpoint: 7, Drop: &events.Drop{Reason: "policy-denied", Direction: "ingress",
			Src: "10.0.0.2", Dst: "10.0.0.3", SrcPort: 40000, DstPort: 8081, Proto: 6, PeerIdentity: 300}},
			"datapath-drop endpoint=7 reason=policy-denied direction=ingress 10.0.0.2:40000 -> 10.0.0.3:8081 proto=6 peer-identity=300"},
		{"drop-v6-no-ports", events.Event{Type: events.DatapathDrop, Endpoint: 2, Drop: &events.Drop{Reason: "fragment", Direction: "egress",
			Src: "fd00::2", Dst: "fd00::3", Proto: 17}},
			"datapath-drop endpoint=2 reason=fragment direction=egress fd00::2 -> fd00::3 proto=17"},
		{"drop-non-ip", events.Event{Type: events.DatapathDrop, Endpoint: 2, Drop: &events.Drop{Reason: "unknown-l3", Direction: "egress"}},
			"datapath-drop endpoint=2 reason=unknown-l3 direction=egress"},
		{"dns", events.Event{Type: events.DNSQuery, Endpoint: 3, Identity: 300, DNS: &events.DNS{Query: "allowed.test.", QType: "A",
			Verdict: "allowed", RCode: "NOERROR", Server: "192.0.2.53:53", IPs: []string{"192.0.2.10"}, TTL: 30}},
			"dns-query endpoint=3 identity=300 query=allowed.test. qtype=A verdict=allowed rcode=NOERROR server=192.0.2.53:53 ips=192.0.2.10 ttl=30"},
		{"l7-denied", events.Event{Type: events.L7Access, Endpoint: 12, L7: &events.L7{Protocol: "http", Verdict: "denied", Reason: "ingress rules deny identity 1001",
			Direction: "ingress", Src: "10.0.0.2:40000", Dst: "10.0.0.3:80", SrcIdentity: 1001, DstIdentity: 1002, Method: "GET", Path: "/private"}},
			`l7-access endpoint=12 http verdict=denied direction=ingress 10.0.0.2:40000 (identity 1001) -> 10.0.0.3:80 (identity 1002) GET /private reason="ingress rules deny identity 1001"`},
		{"l7-grpc-denied", events.Event{Type: events.L7Access, Endpoint: 12, L7: &events.L7{Protocol: "http", Verdict: "denied", Reason: "ingress rules deny identity 1001",
			Direction: "ingress", Src: "10.0.0.2:40000", Dst: "10.0.0.3:50051", SrcIdentity: 1001, DstIdentity: 1002, Method: "POST", Path: "/pkg.Svc/Set",
			HTTPVersion: "HTTP/2.0", GRPC: true, Code: 403, GRPCStatus: 7}},
			`l7-access endpoint=12 http verdict=denied direction=ingress 10.0.0.2:40000 (identity 1001) -> 10.0.0.3:50051 (identity 1002) POST /pkg.Svc/Set HTTP/2.0 grpc code=403 grpc-status=7 reason="ingress rules deny identity 1001"`},
		{"policy-revision", events.Event{Type: events.PolicyRevision, Revision: 4, Message: "1 identities with changed policy"},
			`policy-revision revision=4 "1 identities with changed policy"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := eventText(tc.ev); got != tc.want {
				t.Errorf("eventText = %q, want %q", got, tc.want)
			}
		})
	}
}
