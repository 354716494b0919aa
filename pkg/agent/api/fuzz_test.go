package api

import (
	"errors"
	"net/http"
	"path"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/ifname"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// FuzzEndpointChangeRequest feeds arbitrary PUT bodies and path references
// through the PUT handler's validation (decodeStrict + specFromRequest). It
// must never panic; a refusal is a 400 apiError; an accepted spec is
// consistent.
func FuzzEndpointChangeRequest(f *testing.F) {
	seeds := []struct{ body, ref string }{
		{`{}`, "0"},
		{`{"container-id":"abc","k8s-namespace":"ns","k8s-pod-name":"p","labels":["k8s:app=web","k8s:a=b"],"sync-build":true}`, "0"},
		{`{"addressing":{"ipv4":"10.0.0.1","ipv6":"fd00::1"}}`, "42"},
		{`{"addressing":{"ipv4":"::ffff:10.0.0.1"}}`, "1"},
		{`{"addressing":{"ipv4":"fd00::1"}}`, "1"},
		{`{"addressing":{"ipv6":"fe80::1%eth0"}}`, "1"},
		{`{"id":7}`, "7"},
		{`{"id":70000}`, "0"},
		{`{"id":-1}`, "0"},
		{`{"mac":"00:11:22:33:44:55","host-mac":"AA-BB-CC-DD-EE-FF","interface-index":3}`, "container-id:abc"},
		{`{"k8s-namespace":"ns"}`, "pod-name:ns/pod"},
		{`{"k8s-pod-name":"other"}`, "pod-name:ns/pod"},
		{`{"labels":["k8s:app=a","k8s:app=b"]}`, "0"},
		{`{"labels":["reserved:host"]}`, "0"},
		{`{"bogus":1}`, "0"},
		{`{"named-ports":[{"name":"http","port":80},{"name":"dns","port":53,"protocol":"udp"}]}`, "0"},
		{`{"named-ports":[{"name":"Http","port":80},{"name":"x","port":70000,"protocol":"icmp"}]}`, "0"},
		{`{} {}`, "0"},
		{``, "0"},
		{`{"labels":null,"addressing":null}`, "65535"},
		{`{"interface-index":9223372036854775807}`, "0"},
		{`{"container-id":"a/b"}`, "0"},
		{"{\"container-id\":\"\xff\",\"labels\":[\"k8s:a=b\"]}", "0"},
		{`{"labels":["k8s:a=b"],"container-name":"a\u0000b","k8s-uid":"\u001b"}`, "0"},
		{`{"labels":["k8s:a=b"],"netns":"/run/netns/../x"}`, "0"},
		{`{"labels":["k8s:a=b"],"netns":"/proc/1/ns/net","container-name":"/web"}`, "container-id:c"},
		{`{"labels":["reserved:world","k8s:a=b"]}`, "0"},
		{`{"labels":["k8s:a=\udc80"]}`, "pod-name:ns/p"},
	}
	for _, s := range seeds {
		f.Add([]byte(s.body), s.ref)
	}
	f.Fuzz(func(t *testing.T, body []byte, rawRef string) {
		ref, err := endpoint.ParseRef(rawRef)
		if err != nil {
			return
		}
		var req models.EndpointChangeRequest
		if err := decodeStrict(body, &req); err != nil {
			checkBadRequest(t, "decodeStrict", err)
			return
		}
		spec, err := specFromRequest(ref, &req)
		if err != nil {
			checkBadRequest(t, "specFromRequest", err)
			return
		}
		if spec.IPv4.IsValid() && !spec.IPv4.Is4() {
			t.Fatalf("spec IPv4 %v is not IPv4", spec.IPv4)
		}
		if spec.IPv6.IsValid() && (!spec.IPv6.Is6() || spec.IPv6.Is4In6() || spec.IPv6.Zone() != "") {
			t.Fatalf("spec IPv6 %v is not a plain IPv6 address", spec.IPv6)
		}
		if err := spec.Labels.Validate(); err != nil {
			t.Fatalf("spec labels %q not a valid sorted set: %v", spec.Labels.Strings(), err)
		}
		if int(spec.ID) > endpoint.MaxID || int64(spec.ID) != req.ID && ref.Kind != endpoint.RefID {
			t.Fatalf("spec ID %d from request ID %d", spec.ID, req.ID)
		}
		switch ref.Kind {
		case endpoint.RefID:
			if spec.ID != ref.ID {
				t.Fatalf("spec ID %d, path says %d", spec.ID, ref.ID)
			}
		case endpoint.RefContainerID:
			if spec.ContainerID != ref.ContainerID {
				t.Fatalf("spec container %q, path says %q", spec.ContainerID, ref.ContainerID)
			}
		case endpoint.RefPodName:
			if spec.Namespace != ref.Namespace || spec.PodName != ref.PodName {
				t.Fatalf("spec pod %s/%s, path says %s/%s", spec.Namespace, spec.PodName, ref.Namespace, ref.PodName)
			}
		}
		if (spec.Namespace == "") != (spec.PodName == "") {
			t.Fatalf("spec has namespace %q and pod %q", spec.Namespace, spec.PodName)
		}
		if spec.IfIndex < 0 {
			t.Fatalf("spec interface index %d", spec.IfIndex)
		}
		checkAcceptedText(t, spec)
	})
}

// checkAcceptedText fails unless every string of an accepted spec is
// valid UTF-8 within its limits, free-text fields hold no control
// characters, netns is a clean absolute path and no label is reserved.
func checkAcceptedText(t *testing.T, spec *endpoint.Endpoint) {
	t.Helper()
	for name, v := range map[string]string{"container-id": spec.ContainerID, "container-name": spec.ContainerName,
		"k8s-namespace": spec.Namespace, "k8s-pod-name": spec.PodName, "k8s-uid": spec.PodUID, "netns": spec.Netns,
		"interface-name": spec.IfName, "container-interface-name": spec.ContainerInterfaceName} {
		if !utf8.ValidString(v) || len(v) > maxNetnsPath {
			t.Fatalf("accepted %s %q", name, v)
		}
		for _, r := range v {
			if unicode.IsControl(r) {
				t.Fatalf("accepted %s %q with a control character", name, v)
			}
		}
	}
	if spec.Netns != "" && (!path.IsAbs(spec.Netns) || path.Clean(spec.Netns) != spec.Netns) {
		t.Fatalf("accepted netns %q", spec.Netns)
	}
	if len(spec.Labels) > maxLabels {
		t.Fatalf("accepted %d labels", len(spec.Labels))
	}
	for _, l := range spec.Labels {
		if l.Source == labels.SourceReserved {
			t.Fatalf("accepted reserved label %s", l)
		}
	}
}

// checkBadRequest fails unless err is a 400 apiError with a message.
func checkBadRequest(t *testing.T, op string, err error) {
	t.Helper()
	var ae *apiError
	if !errors.As(err, &ae) {
		t.Fatalf("%s error %v (%T) is not an apiError", op, err, err)
	}
	if ae.status != http.StatusBadRequest && ae.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("%s error %v has status %d, want 400", op, err, ae.status)
	}
	if ae.message == "" || ae.code == "" {
		t.Fatalf("%s error without code or message: %+v", op, ae)
	}
}

func TestDecodeStrict(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		wantErr string // substring; "" means success
	}{
		{"object", `{"container-id":"a"}`, ""},
		{"whitespace around", " \n{}\n ", ""},
		{"empty", "", "empty"},
		{"blank", "  \n\t", "empty"},
		{"malformed", `{"container-id":`, "malformed JSON"},
		{"syntax", `{"a" 1}`, "malformed JSON"},
		{"unknown field", `{"container-idd":"a"}`, `"container-idd"`},
		{"type", `{"labels":"x"}`, `field "labels"`},
		{"trailing object", `{} {}`, "after the JSON object"},
		{"trailing garbage", `{}x`, "after the JSON object"},
		{"array", `[]`, "array"},
		{"null", `null`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var req models.EndpointChangeRequest
			err := decodeStrict([]byte(tt.body), &req)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("decodeStrict(%q) = %v", tt.body, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("decodeStrict(%q) = nil, want an error mentioning %q", tt.body, tt.wantErr)
			}
			checkBadRequest(t, "decodeStrict", err)
			if !contains(err.Error(), tt.wantErr) {
				t.Fatalf("decodeStrict(%q) = %q, want it to mention %q", tt.body, err, tt.wantErr)
			}
		})
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// FuzzAttachRequest feeds arbitrary POST /v1/attach bodies through its
// validation (decodeStrict + attachSpec), all of which runs before any
// netlink call. It must never panic; a refusal is a 400 apiError; an
// accepted request names a kernel interface, a clean absolute netns path,
// an MTU in range and a valid label set.
func FuzzAttachRequest(f *testing.F) {
	for _, s := range []string{
		`{}`,
		`{"container-id":"c1","container-interface-name":"eth0","netns":"/run/netns/p","labels":["cni:network=n"]}`,
		`{"container-id":"c1","container-interface-name":"eth0","netns":"/run/netns/p","labels":["k8s:io.kubernetes.pod.namespace=ns"],"k8s-namespace":"ns","k8s-pod-name":"p","owner":"ns/p","mtu":9000}`,
		`{"container-id":"c1","container-interface-name":"a/b","netns":"/run/netns/p","labels":["cni:network=n"]}`,
		`{"container-id":"c1","container-interface-name":"eth0","netns":"run/../x","labels":["cni:network=n"]}`,
		`{"container-id":"c1","container-interface-name":"eth0","netns":"/p","labels":["cni:network=n"],"mtu":-1}`,
		`{"container-id":"c1","container-interface-name":"eth0","netns":"/p","labels":["cni:network=n"],"owner":"a b"}`,
		`{"container-id":"\u0000","container-interface-name":"eth0","netns":"/p","labels":["cni:network=n"]}`,
		`{"bogus":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req models.AttachRequest
		if err := decodeStrict(body, &req); err != nil {
			checkBadRequest(t, "decodeStrict", err)
			return
		}
		spec, err := attachSpec(&req)
		if err != nil {
			checkBadRequest(t, "attachSpec", err)
			return
		}
		if req.MTU < 68 || req.MTU > 65535 {
			t.Fatalf("accepted MTU %d", req.MTU)
		}
		if !path.IsAbs(spec.Netns) || path.Clean(spec.Netns) != spec.Netns {
			t.Fatalf("accepted netns %q", spec.Netns)
		}
		if !ifname.Valid(spec.ContainerInterfaceName) || !ifname.ValidHost(spec.IfName) {
			t.Fatalf("accepted interfaces %q, host %q", spec.ContainerInterfaceName, spec.IfName)
		}
		if spec.ContainerID != req.ContainerID || spec.ContainerInterfaceName != req.ContainerInterfaceName {
			t.Fatalf("spec names %q/%q from %q/%q", spec.ContainerID, spec.ContainerInterfaceName, req.ContainerID, req.ContainerInterfaceName)
		}
		if err := spec.Labels.Validate(); err != nil || len(spec.Labels) == 0 {
			t.Fatalf("spec labels %q: %v", spec.Labels.Strings(), err)
		}
	})
}
