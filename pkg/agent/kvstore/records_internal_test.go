package kvstore

import (
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// Issue #35: an endpoint record carries the pod's named ports; a record
// whose ports do not validate is refused whole.
func TestDecodeEndpointNamedPorts(t *testing.T) {
	r, err := decodeEndpoint([]byte(`{"ips":["10.1.0.5"],"identity":300,"node":"n2","namedPorts":["http/TCP=8080","dns/UDP=53"]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := hold("n2/1", r, 1).remote().NamedPorts; got.String() != "dns/UDP=53,http/TCP=8080" {
		t.Fatalf("named ports %s", got)
	}
	for _, bad := range []string{`["HTTP=80"]`, `["http=0"]`, `["http/ICMP=1"]`, `["http=80","http=81"]`, `[7]`} {
		if _, err := decodeEndpoint([]byte(`{"ips":["10.1.0.5"],"identity":300,"node":"n2","namedPorts":` + bad + `}`)); err == nil {
			t.Errorf("namedPorts %s: accepted", bad)
		}
	}
	// What the publisher writes decodes back.
	ports := policy.NamedPorts{{Name: "web", Proto: policy.ProtoSCTP, Port: 1}}
	rec := endpointRecord{NamedPorts: []string{ports.String()}}
	if !strings.Contains(rec.NamedPorts[0], "web/SCTP=1") {
		t.Fatalf("record %v", rec.NamedPorts)
	}
}
