// Package arch holds the test that keeps the import rules of
// ARCHITECTURE.md true: dependencies point one way, cmd -> outer ring
// (pkg/agent) -> actors -> datapath/restore -> domain (pkg/domain), and
// nothing outside actors/ touches messages or protoactor.
package arch

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/membrane-cni/membrane"

type pkg struct {
	ImportPath                         string
	Imports, TestImports, XTestImports []string
	Deps                               []string
}

// layer names the layer of a package of this module by its path.
func layer(path string) string {
	rel := strings.TrimPrefix(strings.TrimPrefix(path, module), "/")
	first, _, _ := strings.Cut(rel, "/")
	switch {
	case rel == "actors" || strings.HasPrefix(rel, "actors/"):
		return "actors"
	case rel == "messages":
		return "messages"
	case rel == "datapath/podnet", rel == "datapath/sysctl":
		return "podnet" // the pod's side of an attachment: the agent's ADD and the plugin's CHECK and DEL
	case first == "datapath", first == "restore", first == "bpf":
		return "kernel" // datapath, restore and bpf: kernel and disk
	case strings.HasPrefix(rel, "pkg/domain/"):
		return "domain"
	case rel == "pkg/agent" || strings.HasPrefix(rel, "pkg/agent/"):
		return "outer"
	case strings.HasPrefix(rel, "pkg/clients/"):
		return "clients"
	case rel == "pkg/testutil":
		return "testutil"
	case rel == "pkg/image":
		return "image" // container images, built at build time, never by the agent
	case first == "cmd", first == "sim", first == "test":
		return "top"
	}
	return "unknown:" + rel
}

// allowed lists the layers each layer may import.
var allowed = map[string][]string{
	"domain":   {"domain"},
	"kernel":   {"kernel", "podnet", "domain"},
	"messages": {"kernel", "domain"},
	"actors":   {"actors", "messages", "kernel", "domain"},
	"podnet":   {"domain"},
	"outer":    {"outer", "actors", "kernel", "podnet", "domain", "clients"},
	"clients":  {"clients", "podnet", "domain"},
	"testutil": {},
	"image":    {},
	"top":      {"top", "outer", "actors", "kernel", "podnet", "domain", "clients", "image"},
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-deps=false", "-json=ImportPath,Imports,TestImports,XTestImports,Deps", "./...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decode go list: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages; want the whole module", len(pkgs))
	}
	return pkgs
}

// TestImportRules checks every package's imports against the layer
// table. Tests may also import the layers above theirs (an integration
// test of the plugin runs an agent), but nothing outside actors/, tests
// included, touches messages or protoactor.
func TestImportRules(t *testing.T) {
	for _, p := range listPackages(t) {
		from := layer(p.ImportPath)
		if strings.HasPrefix(from, "unknown:") {
			t.Errorf("%s: no layer; place it in ARCHITECTURE.md's layout and this test", p.ImportPath)
			continue
		}
		tests := slices.Concat(p.TestImports, p.XTestImports)
		for _, imp := range slices.Concat(p.Imports, tests) {
			isTest := !slices.Contains(p.Imports, imp)
			if strings.HasPrefix(imp, "github.com/asynkron/protoactor-go") && from != "actors" && from != "messages" {
				t.Errorf("%s imports %s: only actors/ and messages/ may use protoactor (use the System's front door)", p.ImportPath, imp)
			}
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			to := layer(imp)
			if to == from || (to == "testutil") {
				continue
			}
			if to == "messages" && from != "actors" {
				t.Errorf("%s imports messages: only actors/ may (use the System's front door)", p.ImportPath)
				continue
			}
			if isTest && to != "messages" {
				continue
			}
			if !slices.Contains(allowed[from], to) {
				t.Errorf("%s (%s) imports %s (%s): not allowed", p.ImportPath, from, imp, to)
			}
		}
	}
}

// libcniConfigs are the directories whose Go files may set up libcni to
// run CNI plugins themselves, each with its reason; every other suite
// makes its pods with test/nodeharness (one node harness: a new suite
// adds cases, not another harness).
var libcniConfigs = map[string]string{
	"test/nodeharness": "the node harness",
	"test/cnibench":    "benchmark arms running the reference ptp + host-local plugins too",
	"sim":              "membrane-sim's Linux driver (a program, not a test)",
}

// TestOneNodeHarness: no Go file outside libcniConfigs makes a libcni
// CNIConfig.
func TestOneNodeHarness(t *testing.T) {
	root := "../.."
	setup := "libcni." + "NewCNIConfig" // split, so that this file does not match
	n := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if d.Name() == ".git" || d.Name() == "third_party" || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if filepath.Ext(path) != ".go" {
			return nil
		}
		n++
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if _, ok := libcniConfigs[filepath.Dir(rel)]; !ok && strings.Contains(string(src), setup) {
			t.Errorf("%s sets up libcni: make its pods with test/nodeharness", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 100 {
		t.Fatalf("found %d Go files; want the whole module", n)
	}
}

// TestProxyHalves: membrane-proxy links the proxy's half and the wire
// types, never the agent's xDS server; the agent never links the proxy
// process's half.
func TestProxyHalves(t *testing.T) {
	deps := func(cmd string) []string {
		c := exec.Command("go", "list", "-deps", cmd)
		c.Dir = "../.."
		out, err := c.Output()
		if err != nil {
			t.Fatalf("go list %s: %v", cmd, err)
		}
		return strings.Fields(string(out))
	}
	for _, d := range deps("./cmd/membrane-proxy") {
		if d == module+"/datapath/l7proxy" || strings.HasPrefix(d, "github.com/envoyproxy/go-control-plane/pkg/server") ||
			strings.HasPrefix(d, "github.com/envoyproxy/go-control-plane/pkg/cache") {
			t.Errorf("membrane-proxy links the agent's half: %s", d)
		}
	}
	for _, d := range deps("./cmd/membrane-agent") {
		if d == module+"/datapath/l7proxy/proxy" {
			t.Errorf("membrane-agent links the proxy process's half: %s", d)
		}
	}
}

// TestPluginLinksNoAgent: the CNI plugin, exec'd per pod, links none of
// the agent's layers, nor protoactor or the BPF library.
func TestPluginLinksNoAgent(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "./cmd/membrane-cni")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, module+"/") {
			if l := layer(dep); l != "clients" && l != "podnet" && l != "domain" && l != "top" {
				t.Errorf("membrane-cni links %s (%s)", dep, l)
			}
		}
		for _, banned := range []string{"github.com/asynkron/protoactor-go", "github.com/cilium/ebpf", "github.com/hashicorp/go-memdb"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("membrane-cni links %s", dep)
			}
		}
	}
}

// TestLayerTable makes sure the test can fail: a made-up import of
// messages from the outer ring, and of actors from the domain, are refused.
func TestLayerTable(t *testing.T) {
	for _, tc := range []struct{ from, to string }{
		{module + "/pkg/domain/policy", module + "/actors"},
		{module + "/datapath", module + "/pkg/agent/api"},
		{module + "/pkg/clients/cni", module + "/actors"},
		{module + "/actors", module + "/pkg/agent"},
	} {
		if slices.Contains(allowed[layer(tc.from)], layer(tc.to)) {
			t.Errorf("%s -> %s is allowed; the table must refuse it", tc.from, tc.to)
		}
	}
}

// TestNothingWatchesTheIndex: the index's radix tree (the
// third_party/go-immutable-radix fork) has no watch channels, so a watch
// would wait forever; no production code of the module may use go-memdb's
// watch API.
func TestNothingWatchesTheIndex(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", `{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}`, "./...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	files := strings.Fields(string(out))
	if len(files) < 100 {
		t.Fatalf("go list found %d files; want the whole module", len(files))
	}
	watchAPI := []string{"FirstWatch(", "LastWatch(", "GetWatch(", "WatchCh(", "NewWatchSet(", "WatchSet{", "GetReverseWatch("}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range watchAPI {
			if strings.Contains(string(src), w) {
				t.Errorf("%s uses go-memdb's watch API (%s): the index cannot be watched", f, w)
			}
		}
	}
}

// TestAgentLinksNoEtcdServer: the agent talks to etcd through the client
// only; the server (embedded by tests) must never reach its binary.
func TestAgentLinksNoEtcdServer(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "./cmd/membrane-agent")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "go.etcd.io/etcd/client/v3") {
		t.Errorf("membrane-agent does not link the etcd client: is kvstore mode wired in?")
	}
	for _, dep := range deps {
		if strings.HasPrefix(dep, "go.etcd.io/etcd/server") || strings.HasPrefix(dep, "go.etcd.io/raft") || strings.HasPrefix(dep, "go.etcd.io/bbolt") {
			t.Errorf("membrane-agent links %s", dep)
		}
	}
}
