package api_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestAttachBadRequests: POST /v1/attach refuses what it cannot use with
// a JSON error before any of it reaches a netlink call, and takes no
// address or endpoint on the way. A path that is not a namespace (a
// file, a FIFO that would block an open) is netns-unavailable, at once.
func TestAttachBadRequests(t *testing.T) {
	e := startHandlersAgent(t, nil)
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	req := func(fields ...string) string {
		m := map[string]string{"container-id": `"c1"`, "container-interface-name": `"eth0"`,
			"netns": `"` + file + `"`, "labels": `["cni:network=n"]`}
		for i := 0; i+1 < len(fields); i += 2 {
			if fields[i+1] == "" {
				delete(m, fields[i])
				continue
			}
			m[fields[i]] = fields[i+1]
		}
		var parts []string
		for k, v := range m {
			parts = append(parts, `"`+k+`":`+v)
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
	tests := []struct {
		name, body string
		status     int
		code, msg  string
	}{
		{"not JSON", "{", 400, "invalid-argument", ""},
		{"unknown field", req("bogus", "1"), 400, "invalid-argument", "bogus"},
		{"no container ID", req("container-id", ""), 400, "invalid-argument", "container-id"},
		{"no interface", req("container-interface-name", ""), 400, "invalid-argument", "container-interface-name"},
		{"no netns", req("netns", ""), 400, "invalid-argument", "netns"},
		{"relative netns", req("netns", `"run/netns/x"`), 400, "invalid-argument", "absolute"},
		{"unclean netns", req("netns", `"/run/../run/netns/x"`), 400, "invalid-argument", "clean"},
		{"interface with a slash", req("container-interface-name", `"a/b"`), 400, "invalid-argument", "container-interface-name"},
		{"interface too long", req("container-interface-name", `"abcdefghijklmnop"`), 400, "invalid-argument", "container-interface-name"},
		{"MTU too small", req("mtu", "67"), 400, "invalid-argument", "mtu"},
		{"MTU too large", req("mtu", "65536"), 400, "invalid-argument", "mtu"},
		{"no labels", req("labels", ""), 400, "invalid-argument", "labels"},
		{"bad label", req("labels", `["k8s:"]`), 400, "invalid-argument", "label"},
		{"owner with a space", req("owner", `"a b"`), 400, "invalid-argument", "owner"},
		{"pod without namespace", req("k8s-pod-name", `"p"`), 400, "invalid-argument", "k8s-namespace"},
		{"netns missing", req("netns", `"`+filepath.Join(dir, "none")+`"`), 400, "netns-unavailable", "none"},
		{"netns a file", req(), 400, "netns-unavailable", "not a namespace"},
		{"netns a FIFO", req("netns", `"`+fifo+`"`), 400, "netns-unavailable", "not a namespace"},
		// Chained (CNI chaining after another plugin): no address is
		// allocated, the given ones are checked.
		{"chained without address", req("chained", `{}`), 400, "invalid-address", "at least one"},
		{"chained IPv6 as ipv4", req("chained", `{"ipv4":"fd00::5"}`), 400, "invalid-address", "chained.ipv4"},
		{"chained mapped IPv4 as ipv6", req("chained", `{"ipv6":"::ffff:10.9.0.5"}`), 400, "invalid-address", "chained.ipv6"},
		{"chained loopback", req("chained", `{"ipv4":"127.0.0.5"}`), 400, "invalid-address", "unicast"},
		{"chained multicast", req("chained", `{"ipv6":"ff02::1"}`), 400, "invalid-address", "unicast"},
		{"chained address in the agent's pool", req("chained", `{"ipv4":"10.201.0.9"}`), 400, "invalid-address", "pool"},
		{"chained bad host interface", req("chained", `{"ipv4":"10.9.0.5","host-interface":"../all"}`), 400, "invalid-argument", "host-interface"},
		{"chained bad host index", req("chained", `{"ipv4":"10.9.0.5","host-index":-1}`), 400, "invalid-argument", "host-index"},
		{"port mappings without kube-proxy replacement", req("port-mappings", `[{"host-port":80,"container-port":80,"protocol":"tcp"}]`), 400, "invalid-argument", "kube-proxy-replacement"},
		{"chained netns a file", req("chained", `{"ipv4":"10.9.0.5"}`), 400, "netns-unavailable", "not a namespace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			r := e.do(t, "POST", "/v1/attach", tt.body)
			expectError(t, r, tt.status, tt.code, tt.msg)
			if d := time.Since(start); d > apiWait {
				t.Fatalf("answered after %v", d)
			}
		})
	}
	r := e.do(t, "POST", "/v1/attach?sync=true", req())
	expectError(t, r, http.StatusBadRequest, "invalid-argument", "query")
	st := e.do(t, "GET", "/v1/ipam", "")
	if st.status != http.StatusOK || strings.Contains(string(st.body), `"ip"`) {
		t.Fatalf("addresses after refused attaches: %d %s", st.status, st.body)
	}
	eps := e.do(t, "GET", "/v1/endpoint", "")
	if eps.status != http.StatusOK || strings.TrimSpace(string(eps.body)) != "[]" {
		t.Fatalf("endpoints after refused attaches: %d %s", eps.status, eps.body)
	}
}
