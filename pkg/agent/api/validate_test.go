package api_test

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/agent/api"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// TestRefusedFields sends what a careless or hostile client would: invalid
// UTF-8 anywhere, reserved labels, addresses outside the ranges, control
// characters and huge values in free-text fields, too many labels,
// unclean paths. Each gets a 400 JSON error and nothing changes.
func TestRefusedFields(t *testing.T) {
	e := startHandlersAgent(t, nil)
	ready := e.createPod(t, "c-ready", "ns", "ready")
	id := fmt.Sprint(ready.ID)
	many := make([]string, 257)
	for i := range many {
		many[i] = fmt.Sprintf(`"k8s:l%d=v"`, i)
	}
	hugeLabel := `{"labels":["k8s:app=` + strings.Repeat("v", 200<<10) + `"]}`
	tests := []struct {
		name, method, path, body string
		code, inMessage          string
	}{
		// Invalid UTF-8 is refused, never coerced to U+FFFD (issue 18.6).
		{"path container id", "PUT", "/v1/endpoint/container-id:%FF", `{"labels":["k8s:a=b"]}`, api.CodeInvalid, "UTF-8"},
		{"path pod name", "GET", "/v1/endpoint/pod-name:ns/%C3", "", api.CodeInvalid, "UTF-8"},
		{"body container id", "PUT", "/v1/endpoint/0", "{\"container-id\":\"c\xff\",\"labels\":[\"k8s:a=b\"]}", api.CodeInvalid, "UTF-8"},
		{"body label", "PUT", "/v1/endpoint/0", "{\"labels\":[\"k8s:a=\xfe\"]}", api.CodeInvalid, "UTF-8"},
		{"query filter", "GET", "/v1/endpoint?namespace=%FF", "", api.CodeInvalid, "UTF-8"},
		{"query key", "GET", "/v1/endpoint?%FF=1", "", api.CodeInvalid, "UTF-8"},
		{"ipam owner", "POST", "/v1/ipam?owner=ns/%FF", "", api.CodeInvalid, "UTF-8"},

		// Reserved labels come from the agent only (issue 18.7).
		{"put reserved host", "PUT", "/v1/endpoint/0", `{"labels":["reserved:host"]}`, api.CodeInvalid, "reserved"},
		{"put reserved world", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b","reserved:world"]}`, api.CodeInvalid, "reserved"},
		{"put reserved health", "PUT", "/v1/endpoint/0", `{"labels":["reserved:health"]}`, api.CodeInvalid, "reserved"},
		{"patch add reserved", "PATCH", "/v1/endpoint/" + id + "/labels", `{"add":["reserved:world"]}`, api.CodeInvalid, "reserved"},
		{"patch delete reserved", "PATCH", "/v1/endpoint/" + id + "/labels", `{"delete":["reserved:host"]}`, api.CodeInvalid, "reserved"},

		// Addresses are checked against the ranges before a non-sync PUT
		// answers (issue 18.9).
		{"outside range", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"],"addressing":{"ipv4":"10.99.0.5"}}`, api.CodeInvalidAddress, "10.99.0.5"},
		{"network address", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"],"addressing":{"ipv4":"10.201.0.0"}}`, api.CodeInvalidAddress, "reserved"},
		{"gateway", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"],"addressing":{"ipv4":"10.201.0.1"}}`, api.CodeInvalidAddress, "reserved"},
		{"broadcast", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"],"addressing":{"ipv4":"10.201.0.255"}}`, api.CodeInvalidAddress, "reserved"},
		{"no ipv6 range", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"],"addressing":{"ipv6":"fd00::5"}}`, api.CodeInvalidAddress, "ipv6"},

		// Free-text fields, label counts and sizes (issue 18.10).
		{"container-name NUL", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"],"container-name":"a\u0000b"}`, api.CodeInvalid, "container-name"},
		{"container-name ESC", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"],"container-name":"\u001b[31mred"}`, api.CodeInvalid, "container-name"},
		{"container-name long", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"],"container-name":"` + strings.Repeat("n", 300) + `"}`, api.CodeInvalid, "container-name"},

		// Named ports are IANA_SVC_NAMEs with a port and a protocol (issue #35).
		{"named port uppercase", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"],"named-ports":[{"name":"HTTP","port":80}]}`, api.CodeInvalid, `"named-ports"[0].name`},
		{"named port too long", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"],"named-ports":[{"name":"abcdefghijklmnop","port":80}]}`, api.CodeInvalid, "longer than 15"},
		{"named port digits only", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"],"named-ports":[{"name":"8080","port":80}]}`, api.CodeInvalid, "no letter"},
		{"named port zero", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"],"named-ports":[{"name":"http","port":0}]}`, api.CodeInvalid, `"named-ports"[0].port`},
		{"named port protocol", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"],"named-ports":[{"name":"http","port":80,"protocol":"ICMP"}]}`, api.CodeInvalid, `"named-ports"[0].protocol`},
		{"named port twice", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"],"named-ports":[{"name":"http","port":80},{"name":"http","port":81}]}`, api.CodeInvalid, "both 80 and 81"},
		{"k8s-uid ESC", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"],"k8s-uid":"\u001b"}`, api.CodeInvalid, "k8s-uid"},
		{"k8s-uid long", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"],"k8s-uid":"` + strings.Repeat("u", 300<<10) + `"}`, api.CodeInvalid, "k8s-uid"},
		{"netns NUL", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"],"netns":"/run/netns/a\u0000"}`, api.CodeInvalid, "netns"},
		{"netns relative", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"],"netns":"run/netns/a"}`, api.CodeInvalid, "netns"},
		{"netns dotdot", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"],"netns":"/run/netns/../../proc/1/ns/net"}`, api.CodeInvalid, "netns"},
		{"netns long", "PUT", "/v1/endpoint/0", `{"labels":["k8s:a=b"],"netns":"/` + strings.Repeat("n", 5000) + `"}`, api.CodeInvalid, "netns"},
		{"too many labels", "PUT", "/v1/endpoint/0", `{"labels":[` + strings.Join(many, ",") + `]}`, api.CodeInvalid, "257 labels"},
		{"patch too many labels", "PATCH", "/v1/endpoint/" + id + "/labels", `{"add":[` + strings.Join(many, ",") + `]}`, api.CodeInvalid, "257 labels"},
		{"ipam owner NUL", "POST", "/v1/ipam?owner=ns/a%00", "", api.CodeInvalid, "owner"},
		{"ipam owner ESC", "POST", "/v1/ipam?owner=%1B%5B2J", "", api.CodeInvalid, "owner"},
		{"release owner ESC", "DELETE", "/v1/ipam/10.201.0.77?owner=%1B", "", api.CodeInvalid, "owner"},

		// Unclean paths get a JSON error, not the mux's redirect (issue 18.13).
		{"double slash", "GET", "/v1//status", "", api.CodeInvalid, "canonical"},
		{"dot", "GET", "/v1/./status", "", api.CodeInvalid, "canonical"},
		{"dot dot", "GET", "/v1/endpoint/../status", "", api.CodeInvalid, "canonical"},
		{"dot dot put", "PUT", "/v1/x/../endpoint/0", `{"labels":["k8s:a=b"]}`, api.CodeInvalid, "canonical"},
		{"escaped dot dot", "GET", "/v1/endpoint/container-id:a%2F..%2F..%2Fstatus", "", api.CodeInvalid, "canonical"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.do(t, tt.method, tt.path, tt.body)
			status := http.StatusBadRequest
			expectError(t, r, status, tt.code, tt.inMessage)
			if loc := r.header.Get("Location"); loc != "" {
				t.Errorf("answer redirects to %q", loc)
			}
		})
	}
	t.Run("huge label not echoed", func(t *testing.T) {
		r := e.do(t, "PUT", "/v1/endpoint/0", hugeLabel)
		expectError(t, r, http.StatusBadRequest, api.CodeInvalid, "labels")
		if len(r.body) > 1000 {
			t.Errorf("error body is %d bytes: the label is echoed", len(r.body))
		}
	})
	eps, err := e.client.EndpointList(bg(t), nil)
	if err != nil || len(eps) != 1 || eps[0].ID != ready.ID || len(eps[0].Labels) != 1 {
		t.Fatalf("endpoints after refused calls = %+v, %v", eps, err)
	}
	st, err := e.client.IPAMStatus(bg(t))
	if err != nil || st.IPv4.Used != 1 {
		t.Fatalf("ipam after refused calls = %+v, %v", st, err)
	}
}

// TestAcceptedFields checks the limits let ordinary values through: a
// CNI netns path, a UUID, non-ASCII text, 256 labels.
func TestAcceptedFields(t *testing.T) {
	e := startHandlersAgent(t, nil)
	ls := make([]string, 256)
	for i := range ls {
		ls[i] = fmt.Sprintf(`"k8s:l%d=v"`, i)
	}
	body := `{"labels":[` + strings.Join(ls, ",") + `],"container-name":"/web-ü","k8s-uid":"7d3c4e0a-5a8e-4f7b-9d55-2f1b2b1f2b6e",` +
		`"netns":"/proc/4242/ns/net","addressing":{"ipv4":"10.201.0.254"},"sync-build":true,` +
		`"named-ports":[{"name":"http","port":8080},{"name":"dns","port":53,"protocol":"UDP"},{"name":"a-b-1","port":65535,"protocol":"SCTP"}]}`
	r := e.do(t, "PUT", "/v1/endpoint/container-id:accepted", body)
	if r.status != http.StatusCreated {
		t.Fatalf("PUT = %d %s", r.status, r.body)
	}
	r = e.do(t, "POST", "/v1/ipam?owner=ns/p%C3%BC", "")
	if r.status != http.StatusCreated {
		t.Fatalf("POST /v1/ipam with a UTF-8 owner = %d %s", r.status, r.body)
	}
}

// TestAgentAssignsReservedLabels: the agent itself (as the health manager
// does, through the actors) still creates an endpoint with reserved:health,
// which gets the health identity; the API refuses to relabel it.
func TestAgentAssignsReservedLabels(t *testing.T) {
	e := startHandlersAgent(t, nil)
	sys := e.agent.System
	ls, err := labels.ParseSet([]string{"reserved:health"})
	if err != nil {
		t.Fatal(err)
	}
	spec := &endpoint.Endpoint{ContainerID: "health", Labels: ls, IPv4: netip.MustParseAddr("10.201.0.9")}
	got, err := sys.CreateEndpoint(bg(t), spec, true)
	if err != nil || got.Identity != identity.ReservedHealth {
		t.Fatalf("health endpoint = %+v, %v; want identity %d", got, err, identity.ReservedHealth)
	}
	ref := fmt.Sprint(got.ID)
	r := e.do(t, "PATCH", "/v1/endpoint/"+ref+"/labels", `{"add":["k8s:app=x"]}`)
	expectError(t, r, http.StatusBadRequest, api.CodeInvalid, "managed by the agent")
	ep, err := e.client.EndpointGet(bg(t), ref)
	if err != nil || ep.Identity == nil || ep.Identity.ID != int64(identity.ReservedHealth) {
		t.Fatalf("health endpoint after refused PATCH = %+v, %v", ep, err)
	}
}

// TestNonSyncCreateClaimsFirst: a non-sync PUT whose address another pod
// owns is refused (409 address-in-use) instead of answered 201 and then
// lost when the claim fails; the owner keeps its address.
func TestNonSyncCreateClaimsFirst(t *testing.T) {
	e := startHandlersAgent(t, nil)
	r := e.do(t, "POST", "/v1/ipam?family=ipv4&owner=ns/other", "")
	if r.status != http.StatusCreated {
		t.Fatalf("allocate: %d %s", r.status, r.body)
	}
	var alloc struct {
		Address struct{ IPv4 string } `json:"address"`
	}
	decodeInto(t, r, &alloc)
	body := fmt.Sprintf(`{"container-id":"c-steal","k8s-namespace":"ns","k8s-pod-name":"thief","labels":["k8s:app=thief"],"addressing":{"ipv4":%q}}`, alloc.Address.IPv4)
	r = e.do(t, "PUT", "/v1/endpoint/0", body)
	expectError(t, r, http.StatusConflict, api.CodeAddressInUse, "")
	if _, err := e.client.EndpointGet(bg(t), "container-id:c-steal"); err == nil {
		t.Fatal("the refused endpoint exists")
	}
	row, ok := e.agent.System.Index.IP(netip.MustParseAddr(alloc.Address.IPv4))
	if !ok || row.Owner != "ns/other" || row.Endpoint != 0 {
		t.Fatalf("address row %+v %v, want still owned by ns/other, unclaimed", row, ok)
	}
}
