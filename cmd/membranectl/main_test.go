package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// ctlEnv is an in-process agent (fake datapath) with three endpoints.
type ctlEnv struct {
	socket, server, dir string
	a                   *agent.Agent
}

func startAgent(t *testing.T) *ctlEnv {
	t.Helper()
	dir := t.TempDir()
	cfg := agent.Config{
		Socket:    filepath.Join(dir, "m.sock"),
		StateDir:  filepath.Join(dir, "state"),
		IPv4Range: netip.MustParsePrefix("10.210.0.0/24"),
		IPv6Range: netip.MustParsePrefix("fd00:210::/120"),
		Datapath:  "fake",
		Fake:      datapath.NewFake(1),
		HTTPAddr:  "127.0.0.1:0",
	}
	a, err := agent.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = a.Stop(ctx)
	})
	return &ctlEnv{socket: cfg.Socket, server: "http://" + a.HTTPAddr(), dir: dir, a: a}
}

// populate creates web-0, web-1 and db-0 in namespace default, one after
// the other, so IDs, addresses and identities are deterministic; each has
// an address of both families.
func (e *ctlEnv) populate(t *testing.T) {
	t.Helper()
	c := client.New(e.socket)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, p := range []struct{ pod, app string }{{"web-0", "web"}, {"web-1", "web"}, {"db-0", "db"}} {
		alloc, err := c.IPAMAllocate(ctx, "", "default/"+p.pod)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{ContainerID: "ctr-" + p.pod, K8sNamespace: "default",
			K8sPodName: p.pod, Labels: []string{"k8s:app=" + p.app, "k8s:tier=" + p.app}, SyncBuild: true,
			Addressing: &models.AddressPair{IPv4: alloc.Address.IPv4, IPv6: alloc.Address.IPv6}})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// ctl runs membranectl in process and returns its output and exit code.
func ctl(args ...string) (stdout, stderr string, code int) {
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return o.String(), e.String(), code
}

var (
	timeRE     = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`)
	portRE     = regexp.MustCompile(`127\.0\.0\.1:\d+`)
	volatileRE = regexp.MustCompile(`("?(?:processed|busy-seconds|write-state|realize|proxy-wait|total)"?: )[0-9.e+-]+`)
	cellSplit  = regexp.MustCompile(`\s{2,}`)
)

// volatileColumns vary run to run (message counts, durations).
var volatileColumns = map[string]bool{"PROCESSED": true, "BUSY": true}

// normalize makes output deterministic: times, ports, the temp dir and
// volatile numbers and columns are replaced by placeholders.
func normalize(s, dir string) string {
	s = strings.ReplaceAll(s, dir, "<DIR>")
	s = timeRE.ReplaceAllString(s, "<TIME>")
	s = portRE.ReplaceAllString(s, "127.0.0.1:<PORT>")
	s = volatileRE.ReplaceAllString(s, "${1}<N>")
	return normalizeTables(s)
}

// normalizeTables re-renders tables that have volatile columns, with
// those cells replaced by <N>.
func normalizeTables(s string) string {
	lines := strings.Split(s, "\n")
	var out bytes.Buffer
	for i := 0; i < len(lines); i++ {
		header := cellSplit.Split(strings.TrimSpace(lines[i]), -1)
		var vol []int
		for j, h := range header {
			if volatileColumns[h] {
				vol = append(vol, j)
			}
		}
		if len(vol) == 0 {
			out.WriteString(lines[i])
			if i < len(lines)-1 {
				out.WriteByte('\n')
			}
			continue
		}
		tw := tabwriter.NewWriter(&out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, strings.Join(header, "\t"))
		for i+1 < len(lines) && lines[i+1] != "" {
			i++
			indent := lines[i][:len(lines[i])-len(strings.TrimLeft(lines[i], " "))]
			cells := cellSplit.Split(strings.TrimSpace(lines[i]), -1)
			cells[0] = indent + cells[0]
			for _, j := range vol {
				if j < len(cells) && cells[j] != "-" {
					cells[j] = "<N>"
				}
			}
			fmt.Fprintln(tw, strings.Join(cells, "\t"))
		}
		tw.Flush()
	}
	return out.String()
}

// golden compares got with testdata/name.golden (rewritten with -update).
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if string(want) != got {
		t.Errorf("output differs from %s (go test -update rewrites it)\n--- got:\n%s\n--- want:\n%s", path, got, want)
	}
}

// TestGolden runs membranectl commands against an in-process agent.
func TestGolden(t *testing.T) {
	e := startAgent(t)
	e.populate(t)
	sock := []string{"--socket", e.socket}
	tests := []struct {
		name string
		args []string
		code int
	}{
		{"status", []string{"status"}, exitOK},
		{"status-json", []string{"status", "-o", "json"}, exitOK},
		{"health", []string{"health"}, exitOK},
		{"health-json", []string{"health", "-o", "json"}, exitOK},
		{"endpoint-list", []string{"endpoint", "list"}, exitOK},
		{"endpoint-list-selector", []string{"endpoint", "list", "--selector", "app=web,tier!=db", "--namespace", "default"}, exitOK},
		{"endpoint-list-page", []string{"ep", "ls", "--limit", "2"}, exitOK},
		{"endpoint-list-page2", []string{"ep", "ls", "--limit", "2", "--after", "2"}, exitOK},
		{"endpoint-list-ip-json", []string{"endpoint", "list", "--ip", "10.210.0.3", "-o", "json"}, exitOK},
		{"endpoint-get-yaml", []string{"endpoint", "get", "pod-name:default/db-0"}, exitOK},
		{"endpoint-get-missing", []string{"endpoint", "get", "999"}, exitNotFound},
		{"endpoint-labels", []string{"endpoint", "labels", "1"}, exitOK},
		{"identity-list", []string{"identity", "list"}, exitOK},
		{"identity-get", []string{"identity", "get", "256", "-o", "json"}, exitOK},
		{"ipam-list", []string{"ipam", "list"}, exitOK},
		{"actors", []string{"actors"}, exitOK},
		{"actors-endpoints-json", []string{"actors", "--kind", "endpoint", "-o", "json"}, exitOK},
		{"actors-stuck", []string{"actors", "--stuck", "1h"}, exitOK},
		{"actor-get", []string{"actor", "get", "ep-3"}, exitOK},
		{"actor-get-missing", []string{"actor", "get", "agent/nope"}, exitNotFound},
		{"usage-unknown-command", []string{"frobnicate"}, exitUsage},
		{"usage-bad-output", []string{"status", "-o", "xml"}, exitUsage},
		{"usage-missing-ref", []string{"endpoint", "get"}, exitUsage},
		{"usage-bad-flag", []string{"endpoint", "list", "--colour"}, exitUsage},
		{"bad-selector", []string{"endpoint", "list", "--selector", "=x"}, exitError},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := ctl(append(append([]string{}, sock...), tc.args...)...)
			if code != tc.code {
				t.Errorf("exit code %d, want %d (stderr %q)", code, tc.code, errOut)
			}
			golden(t, tc.name, normalize(fmt.Sprintf("$ membranectl %s\n%s--- stderr\n%s--- exit %d\n",
				strings.Join(tc.args, " "), out, errOut, code), e.dir))
		})
	}
}

// TestServerFlag talks to the read-only HTTP listener.
func TestServerFlag(t *testing.T) {
	e := startAgent(t)
	e.populate(t)
	tests := []struct {
		name string
		args []string
		code int
	}{
		{"server-endpoint-list", []string{"endpoint", "list", "--state", "ready"}, exitOK},
		{"server-delete-refused", []string{"endpoint", "delete", "1"}, exitError},
		{"server-bad-url", []string{"status"}, exitUsage},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			server := e.server
			if tc.name == "server-bad-url" {
				server = "ftp://x"
			}
			out, errOut, code := ctl(append([]string{"--server", server}, tc.args...)...)
			if code != tc.code {
				t.Errorf("exit code %d, want %d (stderr %q)", code, tc.code, errOut)
			}
			golden(t, tc.name, normalize(fmt.Sprintf("$ membranectl --server URL %s\n%s--- stderr\n%s--- exit %d\n",
				strings.Join(tc.args, " "), out, errOut, code), e.dir))
		})
	}
}

func TestUnreachable(t *testing.T) {
	_, errOut, code := ctl("--socket", filepath.Join(t.TempDir(), "none.sock"), "status")
	if code != exitUnreachable || !strings.Contains(errOut, "none.sock") {
		t.Fatalf("exit %d, stderr %q; want %d naming the socket", code, errOut, exitUnreachable)
	}
}

// policyStub stands in for the policy and ipcache API (implemented on
// another branch) with the agreed shapes, recording what it was sent.
type policyStub struct {
	mu   sync.Mutex
	reqs []string
}

func (p *policyStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	p.mu.Lock()
	p.reqs = append(p.reqs, fmt.Sprintf("%s %s ct=%q body=%q", r.Method, r.URL.RequestURI(), r.Header.Get("Content-Type"), body))
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == "PUT" && r.URL.Path == "/v1/policy":
		fmt.Fprint(w, `{"revision": 7, "policies": ["default/allow-web", "default/deny-db"]}`)
	case r.Method == "GET" && r.URL.Path == "/v1/policy":
		fmt.Fprint(w, `{"revision": 7, "policies": [{"name": "allow-web", "namespace": "default", "kind": "CiliumNetworkPolicy",
			"spec": {"endpointSelector": {"matchLabels": {"app": "web"}}}}, {"name": "deny-db", "namespace": "default", "kind": "NetworkPolicy", "spec": {}}]}`)
	case r.Method == "DELETE" && r.URL.Path == "/v1/policy":
		fmt.Fprint(w, `{"revision": 8, "deleted": 1}`)
	case r.Method == "GET" && r.URL.Path == "/v1/endpoint/3/policy":
		fmt.Fprint(w, `{"id": 3, "identity": 300, "policy-revision": 7, "ingress-enforced": true, "egress-enforced": false,
 "computed": [{"identity": 257, "port": 80, "protocol": "TCP", "direction": "ingress"}],
 "realized": [{"identity": 257, "port": 80, "protocol": "TCP", "direction": "ingress", "packets": 12, "bytes": 960}],
 "computed-cidr": [{"cidr": "10.0.0.0/8", "port": 443, "protocol": "TCP", "direction": "egress", "allow": true}],
 "realized-cidr": [{"cidr": "10.0.0.0/8", "port": 443, "protocol": "TCP", "direction": "egress", "allow": true, "packets": 2, "bytes": 120}],
 "realized-ingress-enforced": true, "realized-egress-enforced": false,
 "drops": [{"reason": "policy-denied", "direction": "ingress", "packets": 3, "bytes": 180}]}`)
	case r.Method == "GET" && r.URL.Path == "/v1/drops":
		fmt.Fprint(w, `[{"endpoint": 3, "reason": "policy-denied", "direction": "ingress", "packets": 3, "bytes": 180},
 {"endpoint": 7, "reason": "fragment", "direction": "egress", "packets": 1, "bytes": 1500}]`)
	case r.Method == "GET" && r.URL.Path == "/v1/service":
		fmt.Fprint(w, `{"services": [{"frontend": "10.96.0.10:5432/TCP", "name": "default/db", "port-name": "sql", "kind": "ClusterIP",
 "source": "k8s", "id": 1, "backends": ["10.200.0.5:5432", "10.200.0.6:5432"], "state": "realized",
 "realized": {"id": 1, "backends": ["10.200.0.5:5432", "10.200.0.6:5432"]}},
 {"frontend": "10.96.0.11:80/TCP", "name": "default/empty", "kind": "ClusterIP", "source": "k8s", "id": 2, "backends": [], "state": "failed", "error": "injected"},
 {"frontend": "192.0.2.1:30432/TCP", "name": "default/db", "port-name": "sql", "kind": "NodePort", "source": "k8s", "id": 3,
 "backends": ["10.200.0.5:5432"], "state": "realized", "realized": {"id": 3, "backends": ["10.200.0.5:5432"], "external": true, "local": ["10.200.0.5:5432"]}}],
 "maps": {"frontends": 2, "backends": 3, "connections": 4, "reverse-nat": 4, "affinity": 0, "nodeport-nat": 2, "nodeport-snat": 0, "sockets": 7,
 "hooks": {"kube-proxy-replacement": true, "cgroup": "/sys/fs/cgroup", "socket-programs": ["connect4", "sendmsg4", "recvmsg4", "getpeername4"], "devices": ["eth0"]}}}`)
	case r.Method == "GET" && r.URL.Path == "/v1/fqdn/cache":
		fmt.Fprint(w, `[{"endpoint": 3, "fqdn": "allowed.test.", "ip": "192.0.2.10", "expiration-time": "2026-11-27T08:00:30Z", "ttl": 30}]`)
	case r.Method == "GET" && r.URL.Path == "/v1/ipcache":
		fmt.Fprint(w, `[{"cidr": "10.200.0.5/32", "identity": 257, "source": "endpoint"}, {"cidr": "0.0.0.0/0", "identity": 2, "source": "reserved"}]`)
	case r.Method == "GET" && r.URL.Path == "/v1/nodes":
		fmt.Fprint(w, `[{"name": "b", "source": "file", "addresses": ["192.0.2.2"], "podCIDRs": ["10.2.0.0/24", "fd00:2::/64"], "active": true},
 {"name": "b", "source": "k8s", "addresses": ["192.0.2.22"], "podCIDRs": ["10.2.0.0/24"], "active": false}]`)
	default:
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"code": "not-found", "message": "no route"}`)
	}
}

func TestPolicyCommands(t *testing.T) {
	stub := &policyStub{}
	srv := httptest.NewServer(stub)
	defer srv.Close()
	dir := t.TempDir()
	yamlFile := filepath.Join(dir, "p.yaml")
	jsonFile := filepath.Join(dir, "p.json")
	_ = os.WriteFile(yamlFile, []byte("apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\n"), 0o644)
	_ = os.WriteFile(jsonFile, []byte(`{"kind": "NetworkPolicy"}`), 0o644)
	tests := []struct {
		name string
		args []string
		code int
	}{
		{"policy-import-yaml", []string{"policy", "import", yamlFile}, exitOK},
		{"policy-import-json", []string{"policy", "import", jsonFile, "-o", "json"}, exitOK},
		{"policy-get", []string{"policy", "get"}, exitOK},
		{"policy-get-yaml", []string{"policy", "get", "-o", "yaml"}, exitOK},
		{"policy-delete-name", []string{"policy", "delete", "default/allow-web"}, exitOK},
		{"policy-delete-labels", []string{"policy", "delete", "--labels", "app=web,team=a"}, exitOK},
		{"policy-delete-usage", []string{"policy", "delete"}, exitUsage},
		{"policy-import-missing-file", []string{"policy", "import", filepath.Join(dir, "none.yaml")}, exitError},
		{"policy-no-subcommand", []string{"policy", "frob"}, exitUsage},
		{"endpoint-policy", []string{"endpoint", "policy", "3"}, exitOK},
		{"drops", []string{"drops"}, exitOK},
		{"drops-json", []string{"drops", "-o", "json"}, exitOK},
		{"ipcache-list", []string{"ipcache", "list"}, exitOK},
		{"ipcache-list-json", []string{"ipcache", "list", "-o", "json"}, exitOK},
		{"service-list-maps", []string{"service", "list", "--maps"}, exitOK},
		{"service-list-json", []string{"service", "list", "-o", "json"}, exitOK},
		{"node-list", []string{"node", "list"}, exitOK},
		{"node-list-json", []string{"node", "list", "-o", "json"}, exitOK},
		{"fqdn-list", []string{"fqdn", "list", "-e", "3", "-p", "*.test"}, exitOK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stub.mu.Lock()
			stub.reqs = nil
			stub.mu.Unlock()
			out, errOut, code := ctl(append([]string{"--server", srv.URL}, tc.args...)...)
			if code != tc.code {
				t.Errorf("exit code %d, want %d (stderr %q)", code, tc.code, errOut)
			}
			stub.mu.Lock()
			sent := strings.Join(stub.reqs, "\n")
			stub.mu.Unlock()
			golden(t, tc.name, normalize(fmt.Sprintf("$ membranectl %s\n%s--- stderr\n%s--- exit %d\n--- requests\n%s\n",
				strings.Join(tc.args, " "), out, errOut, code, sent), dir))
		})
	}
}

// TestMonitor follows the event stream while an endpoint comes and goes.
func TestMonitor(t *testing.T) {
	e := startAgent(t)
	var out, errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"--socket", e.socket, "monitor", "--type", "endpoint-created,endpoint-deleted,identity-allocated,identity-released", "--count", "4", "--timeout", "20s"}, &out, &errOut)
	}()
	c := client.New(e.socket)
	defer c.Close()
	ctx := context.Background()
	// Wait until the stream is open: the agent then has a subscriber.
	for e.a.System.Events().Subscribers() == 0 {
		time.Sleep(time.Millisecond)
	}
	if _, err := c.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{ContainerID: "ctr-m", K8sNamespace: "default",
		K8sPodName: "m", Labels: []string{"k8s:app=m"}, SyncBuild: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.EndpointDelete(ctx, "container-id:ctr-m"); err != nil {
		t.Fatal(err)
	}
	if code := <-done; code != exitOK {
		t.Fatalf("monitor exit %d: %s", code, errOut.String())
	}
	golden(t, "monitor", normalize(out.String(), e.dir))

	// -o json: one event per line, resuming after event 1.
	out.Reset()
	if code := run([]string{"--socket", e.socket, "monitor", "--since", "1", "--count", "2", "-o", "json", "--timeout", "20s"}, &out, &errOut); code != exitOK {
		t.Fatalf("monitor -o json exit %d: %s", code, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	for i, l := range lines {
		var ev struct{ Seq int }
		if err := json.Unmarshal([]byte(l), &ev); err != nil || ev.Seq != i+2 {
			t.Fatalf("line %d %q: seq %d, err %v", i, l, ev.Seq, err)
		}
	}
}

func TestCompletion(t *testing.T) {
	out, errOut, code := ctl("completion", "bash")
	if code != exitOK || !strings.Contains(out, "__start_membranectl") {
		t.Fatalf("completion bash: exit %d, stderr %q", code, errOut)
	}
}
