package cni

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/membrane-cni/membrane/pkg/domain/ifname"
)

func code(err error) uint {
	var te *types.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 0
}

func TestParseConfigDefaults(t *testing.T) {
	c, err := ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"k8s","type":"membrane-cni","runtimeConfig":{"x":1},"unknownKey":true}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Socket != DefaultSocket || c.DeleteQueueDir != DefaultDeleteQueueDir || c.MTU != DefaultMTU {
		t.Fatalf("defaults = %+v", c)
	}
}

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		in      string
		ns, pod string
		code    uint
	}{
		{"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1", "default", "web-0", 0},
		{"", "", "", 0},
		{"FOO=bar;;K8S_POD_NAMESPACE=a;K8S_POD_NAME=b;", "a", "b", 0},
		{"IgnoreUnknown=0;OTHER=x", "", "", 0}, // unknown keys are tolerated regardless
		{"K8S_POD_NAMESPACE=a", "", "", 4},
		{"K8S_POD_NAMESPACE=a;K8S_POD_NAME=b c", "", "", 4},
		{"=x", "", "", 4},
		{"K8S_POD_NAME=" + strings.Repeat("a", 300) + ";K8S_POD_NAMESPACE=a", "", "", 4},
	} {
		a, err := ParseArgs(tc.in)
		if code(err) != tc.code || (err == nil && (a.Namespace != tc.ns || a.Pod != tc.pod)) {
			t.Errorf("ParseArgs(%q) = %+v, %v; want %s/%s code %d", tc.in, a, err, tc.ns, tc.pod, tc.code)
		}
	}
	if got := (Args{Namespace: "a", Pod: "b"}).Owner(); got != "a/b" {
		t.Errorf("Owner = %q", got)
	}
	if got := (Args{}).Owner(); got != "" {
		t.Errorf("Owner = %q", got)
	}
}

func TestVethNames(t *testing.T) {
	host, tmp := VethNames(strings.Repeat("f", 64), "eth0")
	if len(host) != 15 || len(tmp) != 15 || !strings.HasPrefix(host, "lxc") || !strings.HasPrefix(tmp, "tmp") || host[3:] != tmp[3:] {
		t.Fatalf("VethNames = %q, %q", host, tmp)
	}
	if !ifname.ValidHost(host) {
		t.Fatalf("host name %q is not of the pattern the agent accepts", host)
	}
	// The names nodes already have: the first 12 hex digits of the
	// SHA-256 of container ID, NUL, interface name (an agent or plugin
	// that named them otherwise would lose track of existing pods).
	sum := sha256.Sum256([]byte(strings.Repeat("f", 64) + "\x00eth0"))
	if want := "lxc" + hex.EncodeToString(sum[:])[:12]; host != want {
		t.Fatalf("VethNames = %q, want %q", host, want)
	}
	if h2, _ := VethNames("other", "eth0"); h2 == host {
		t.Fatal("different containers share a host veth name")
	}
	// Two attachments of one container, and IDs that join alike.
	if h2, _ := VethNames(strings.Repeat("f", 64), "net1"); h2 == host {
		t.Fatal("two attachments of one container share a host veth name")
	}
	if a, _ := VethNames("ab", "c"); a == func() string { b, _ := VethNames("a", "bc"); return b }() {
		t.Fatal("attachments ab/c and a/bc share a host veth name")
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"cniVersion":"1.1.0","name":"n","type":"membrane-cni","mtu":1450,"socket":"/run/m.sock"}`))
	f.Add([]byte(`{"cniVersion":"0.3.1","name":"n","prevResult":{"ips":[]}}`))
	f.Add([]byte(`{"name":"n","mtu":-1}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			if c := code(err); c != 1 && c != 6 && c != 7 {
				t.Fatalf("ParseConfig error with code %d: %v", c, err)
			}
			return
		}
		if c.MTU < 68 || c.MTU > 65535 || !strings.HasPrefix(c.Socket, "/") || !strings.HasPrefix(c.DeleteQueueDir, "/") || !supported(c.CNIVersion) || c.Name == "" {
			t.Fatalf("ParseConfig accepted %+v", c)
		}
	})
}

func FuzzParseArgs(f *testing.F) {
	f.Add("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u")
	f.Add("a=b;c")
	f.Add(";;=;")
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseArgs(s)
		if err != nil {
			if code(err) != 4 || !strings.Contains(err.Error(), "CNI_ARGS") {
				t.Fatalf("ParseArgs error %v: want code 4 naming CNI_ARGS", err)
			}
			return
		}
		if (a.Namespace == "") != (a.Pod == "") {
			t.Fatalf("ParseArgs(%q) = %+v: namespace and pod must come together", s, a)
		}
		for _, v := range []string{a.Namespace, a.Pod, a.UID, a.InfraContainerID} {
			if !validArgValue(v) {
				t.Fatalf("ParseArgs(%q) accepted value %q", s, v)
			}
		}
	})
}
