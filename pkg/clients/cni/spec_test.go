package cni_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/membrane-cni/membrane/pkg/clients/cni"
	"github.com/membrane-cni/membrane/pkg/clients/cni/delqueue"
)

// runPlugin execs the built plugin as a runtime would and returns its
// stdout and whether it exited 0.
func runPlugin(t *testing.T, env map[string]string, stdin string) (string, bool) {
	t.Helper()
	cmd := exec.Command(filepath.Join(pluginDir, "membrane-cni"))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout = &out
	err := cmd.Run()
	if _, isExit := err.(*exec.ExitError); err != nil && !isExit {
		t.Fatalf("run plugin: %v", err)
	}
	return out.String(), err == nil
}

func TestSpecErrors(t *testing.T) {
	const good = `{"cniVersion":"1.1.0","name":"n","type":"membrane-cni","socket":"/nonexistent/agent.sock","deleteQueueDir":"/nonexistent/q"}`
	base := func(cmd string) map[string]string {
		return map[string]string{"CNI_COMMAND": cmd, "CNI_CONTAINERID": "c1", "CNI_NETNS": "/nonexistent/netns",
			"CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin", "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p"}
	}
	with := func(env map[string]string, k, v string) map[string]string {
		if v == "" {
			delete(env, k)
		} else {
			env[k] = v
		}
		return env
	}
	for _, tc := range []struct {
		name  string
		env   map[string]string
		stdin string
		code  uint
		names string // the message must name this
	}{
		{"no container id", with(base("ADD"), "CNI_CONTAINERID", ""), good, 4, "CNI_CONTAINERID"},
		{"no netns", with(base("ADD"), "CNI_NETNS", ""), good, 4, "CNI_NETNS"},
		{"no ifname", with(base("DEL"), "CNI_IFNAME", ""), good, 4, "CNI_IFNAME"},
		{"unknown command", base("FROB"), good, 4, "FROB"},
		{"CNI_ARGS pair without =", with(base("ADD"), "CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME"), good, 4, "CNI_ARGS"},
		{"CNI_ARGS pod without namespace", with(base("ADD"), "CNI_ARGS", "K8S_POD_NAME=p"), good, 4, "CNI_ARGS"},
		{"CNI_ARGS bad value", with(base("ADD"), "CNI_ARGS", "K8S_POD_NAMESPACE=a/b;K8S_POD_NAME=p"), good, 4, "K8S_POD_NAMESPACE"},
		{"ifname all", with(base("ADD"), "CNI_IFNAME", "all"), good, 4, "CNI_IFNAME"},
		{"ifname template", with(base("ADD"), "CNI_IFNAME", "eth%d"), good, 4, "CNI_IFNAME"},
		{"ifname default", with(base("CHECK"), "CNI_IFNAME", "default"), good, 4, "CNI_IFNAME"},
		{"undecodable", base("ADD"), `{"cniVersion":`, 6, "network config"},
		{"mtu wrong type", base("ADD"), `{"cniVersion":"1.1.0","name":"n","type":"membrane-cni","mtu":"big"}`, 6, "mtu"},
		{"mtu out of range", base("ADD"), `{"cniVersion":"1.1.0","name":"n","type":"membrane-cni","mtu":10}`, 7, "mtu"},
		{"relative socket", base("ADD"), `{"cniVersion":"1.1.0","name":"n","type":"membrane-cni","socket":"agent.sock"}`, 7, "socket"},
		{"relative queue", base("ADD"), `{"cniVersion":"1.1.0","name":"n","type":"membrane-cni","deleteQueueDir":"q"}`, 7, "deleteQueueDir"},
		{"agentTimeout not a duration", base("ADD"), `{"cniVersion":"1.1.0","name":"n","type":"membrane-cni","agentTimeout":"soon"}`, 7, "agentTimeout"},
		{"agentTimeout too short", base("ADD"), `{"cniVersion":"1.1.0","name":"n","type":"membrane-cni","agentTimeout":"10ms"}`, 7, "agentTimeout"},
		{"foreign ipam", base("ADD"), `{"cniVersion":"1.1.0","name":"n","type":"membrane-cni","ipam":{"type":"host-local"}}`, 7, "ipam"},
		{"no name", base("ADD"), `{"cniVersion":"1.1.0","type":"membrane-cni"}`, 7, "name"},
		{"old version", base("ADD"), `{"cniVersion":"0.2.0","name":"n","type":"membrane-cni"}`, 1, "0.2.0"},
		{"future version", base("ADD"), `{"cniVersion":"9.9.9","name":"n","type":"membrane-cni"}`, 1, "9.9.9"},
		{"CHECK before 0.4.0", base("CHECK"), `{"cniVersion":"0.3.1","name":"n","type":"membrane-cni"}`, 1, "CHECK"},
		{"CHECK without prevResult", base("CHECK"), good, 7, "prevResult"},
		{"STATUS before 1.1.0", base("STATUS"), `{"cniVersion":"1.0.0","name":"n","type":"membrane-cni"}`, 1, "STATUS"},
		{"ADD with a missing netns", base("ADD"), good, cni.CodeNetns, "/nonexistent/netns"},
		{"STATUS without agent", base("STATUS"), good, 50, "agent"},
		{"GC without agent", base("GC"), good, 11, "agent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, ok := runPlugin(t, tc.env, tc.stdin)
			if ok {
				t.Fatalf("plugin succeeded: %s", out)
			}
			var e struct {
				CNIVersion string `json:"cniVersion"`
				Code       uint   `json:"code"`
				Msg        string `json:"msg"`
				Details    string `json:"details"`
			}
			if err := json.Unmarshal([]byte(out), &e); err != nil {
				t.Fatalf("stdout is not a spec error: %v: %q", err, out)
			}
			if e.Code != tc.code || !strings.Contains(e.Msg+" "+e.Details, tc.names) {
				t.Fatalf("error = %d %q %q; want code %d naming %q", e.Code, e.Msg, e.Details, tc.code, tc.names)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	out, ok := runPlugin(t, map[string]string{"CNI_COMMAND": "VERSION"}, "")
	if !ok {
		t.Fatalf("VERSION failed: %s", out)
	}
	var v struct {
		Supported []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil || strings.Join(v.Supported, ",") != "0.3.1,0.4.0,1.0.0,1.1.0" {
		t.Fatalf("VERSION = %s (%v)", out, err)
	}
}

// TestDelBestEffort: DEL must not wedge a pod (runtimes retry a failing
// DEL forever). CNI_ARGS or config details the plugin dislikes do not
// fail it: with the agent unreachable, each DEL below queues its
// deletion and exits 0. It fails only when the deletion can neither be
// done nor queued.
func TestDelBestEffort(t *testing.T) {
	dir := t.TempDir()
	queue := filepath.Join(dir, "queue")
	conf := func(extra string) string {
		return `{"cniVersion":"1.1.0","name":"n","type":"membrane-cni","socket":"` + filepath.Join(dir, "none.sock") +
			`","deleteQueueDir":"` + queue + `"` + extra + `}`
	}
	env := func(cid, ifname, args string) map[string]string {
		return map[string]string{"CNI_COMMAND": "DEL", "CNI_CONTAINERID": cid, "CNI_NETNS": filepath.Join(dir, "gone-netns"),
			"CNI_IFNAME": ifname, "CNI_PATH": "/opt/cni/bin", "CNI_ARGS": args}
	}
	queued := func() int {
		t.Helper()
		names, err := delqueue.List(queue)
		if err != nil {
			t.Fatal(err)
		}
		return len(names)
	}
	for i, tc := range []struct {
		name, ifname, args, stdin string
		queues                    bool
	}{
		{"pod without namespace", "eth0", "IgnoreUnknown=1;K8S_POD_NAME=p", conf(""), true},
		{"CNI_ARGS pair without =", "eth0", "IgnoreUnknown=1;K8S_POD_NAME", conf(""), true},
		{"CNI_ARGS bad value", "eth0", "K8S_POD_NAMESPACE=a/b;K8S_POD_NAME=p", conf(""), true},
		{"mtu out of range", "eth0", "", conf(`,"mtu":10`), true},
		{"agentTimeout not a duration", "eth0", "", conf(`,"agentTimeout":"soon"`), true},
		{"foreign ipam", "eth0", "", conf(`,"ipam":{"type":"host-local"}`), true},
		{"second attachment", "net1", "", conf(""), true},
		{"interface name ADD refuses", "all", "", conf(""), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := queued()
			out, ok := runPlugin(t, env(fmt.Sprintf("c%d", i), tc.ifname, tc.args), tc.stdin)
			if !ok {
				t.Fatalf("DEL failed: %s", out)
			}
			if got := queued() - before; (got == 1) != tc.queues {
				t.Fatalf("DEL queued %d entries, want queued=%v", got, tc.queues)
			}
		})
	}
	t.Run("queue unwritable", func(t *testing.T) {
		blocked := filepath.Join(dir, "file")
		if err := os.WriteFile(blocked, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		stdin := strings.Replace(conf(""), queue, filepath.Join(blocked, "q"), 1)
		out, ok := runPlugin(t, env("c-blocked", "eth0", ""), stdin)
		if ok || !strings.Contains(out, `"code": 107`) && !strings.Contains(out, `"code":107`) {
			t.Fatalf("DEL with an unwritable queue and no agent = ok %v, %s; want error 107", ok, out)
		}
	})
}

// TestDelAgentAnswers: what DEL does with each kind of agent answer. A
// failing agent (5xx) gets the deletion queued and DEL succeeds; an agent
// without the attachment (404, or 400: it never created one with such an
// ID) leaves nothing to queue.
func TestDelAgentAnswers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		code   string
		queues bool
	}{
		{"deleted", 200, "", false},
		{"not found", 404, "not-found", false},
		{"refused", 400, "invalid-argument", false},
		{"internal error", 500, "state-write-failed", true},
		{"timeout", 504, "timeout", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, err := os.MkdirTemp("", "mbt-del-") // short: a socket path has 107 bytes
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			sock, queue := filepath.Join(dir, "a.sock"), filepath.Join(dir, "q")
			var mu sync.Mutex // guards got
			var got []string
			lis, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				mu.Lock()
				got = append(got, r.Method+" "+r.URL.Path+" "+string(body))
				mu.Unlock()
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.status)
				if tc.code != "" {
					fmt.Fprintf(w, `{"code":%q,"message":"test"}`, tc.code)
				} else {
					fmt.Fprint(w, `{"deleted":[1]}`)
				}
			})}
			go srv.Serve(lis)
			t.Cleanup(func() { srv.Close() })
			stdin := `{"cniVersion":"1.0.0","name":"n","type":"membrane-cni","socket":"` + sock + `","deleteQueueDir":"` + queue + `"}`
			env := map[string]string{"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c1", "CNI_NETNS": filepath.Join(dir, "gone"),
				"CNI_IFNAME": "net1", "CNI_PATH": "/opt/cni/bin"}
			out, ok := runPlugin(t, env, stdin)
			if !ok {
				t.Fatalf("DEL failed: %s", out)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(got) != 1 || !strings.Contains(got[0], `DELETE /v1/endpoint {"container-id":"c1","container-interface-name":"net1"}`) {
				t.Fatalf("agent saw %q", got)
			}
			names, _ := delqueue.List(queue)
			if (len(names) == 1) != tc.queues {
				t.Fatalf("queued %d entries, want queued=%v", len(names), tc.queues)
			}
		})
	}
}
