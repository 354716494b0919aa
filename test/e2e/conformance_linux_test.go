//go:build linux

package e2e

import (
	"bufio"
	"context"
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/image"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// Upstream's image names for Kubernetes v1.35.4
// (k8s.io/kubernetes/test/utils/image/manifest.go): the suite runs with
// these refs and, as every image is on every node, never pulls.
const (
	agnhostRef = "registry.k8s.io/e2e-test-images/agnhost:2.59"
	busyboxRef = "registry.k8s.io/e2e-test-images/busybox:1.37.0-1"
	pauseRef   = "registry.k8s.io/pause:3.10.1"
	jessieRef  = "registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7"
)

// conformanceSet is one e2e.test run: the specs whose full text matches
// Focus and not Skip (Go regexps, as ginkgo matches them).
type conformanceSet struct {
	Focus, Skip string
}

// skipAlways leaves out what no single-machine cluster without a cloud
// can run, whatever the CNI: Disruptive and Flaky specs, LoadBalancer
// Services (a cloud's), and IPv6/dual-stack (the cluster is IPv4).
const skipAlways = `\[Disruptive\]|\[Flaky\]|LoadBalancer|\[Feature:IPv6DualStack\]|\[LinuxOnly\]\[Feature:IPv6`

// conformanceSets are the sets make conformance runs (CONFORMANCE_SETS
// picks some, in order; docs/conformance.md says why each is selected).
var conformanceSets = map[string]conformanceSet{
	// Every NetworkPolicy spec of sig-network but SCTP's, an optional
	// feature upstream gates behind [Feature:SCTPConnectivity].
	"netpol": {Focus: `\[sig-network\] Netpol`, Skip: skipAlways + `|\[Feature:SCTPConnectivity\]`},
	// Every sig-network spec tagged [Conformance].
	"conformance": {Focus: `\[sig-network\].*\[Conformance\]`, Skip: skipAlways},
	// The Services specs a kube-proxy replacement must pass (the
	// [Conformance] ones are in the set above).
	"services": {
		Focus: `\[sig-network\] Services .*([Ss]ession [Aa]ffinity|NodePort|[Hh]airpin|[Ee]xternall?[Tt]raffic[Pp]olicy|[Ii]nternal[Tt]raffic[Pp]olicy)`,
		Skip:  skipAlways + `|\[Conformance\]`,
	},
	// The CI subset: a handful of NetworkPolicy specs and the granular
	// pod-to-pod checks (make conformance-smoke).
	"smoke": {
		Focus: `\[sig-network\] Netpol NetworkPolicy between server and client should (support a 'default-deny-ingress' policy|enforce policy to allow traffic from pods within server namespace based on PodSelector|enforce policy based on Ports|support allow-all policy|enforce policy based on NamespaceSelector with MatchExpressions) ` +
			`|\[sig-network\] Networking Granular Checks: Pods should function for intra-pod communication: (http|udp)`,
		Skip: skipAlways,
	},
}

// TestConformance runs upstream's Kubernetes e2e suite, e2e.test built
// from k8s.io/kubernetes v1.35.4's test/e2e restricted to the network
// tests (scripts/e2e-bin.sh), against the cluster: Membrane as the CNI
// and the kube-proxy replacement, no kube-proxy. Before the suite it
// imports upstream's agnhost image (agnhost plus a shell, a full nc and
// curl), busybox and pause images into every node, so nothing is pulled.
// Every set (CONFORMANCE_SETS, comma-separated names of conformanceSets;
// CONFORMANCE_FOCUS instead runs the specs its regexp matches as the set
// "focus") is one e2e.test process, up to CONFORMANCE_JOBS at once, writing its
// JUnit report and log to CONFORMANCE_RESULTS/<set>/; summary.md there
// lists the passed, failed and skipped specs (each skip with the suite's
// reason). make conformance and make conformance-smoke run it.
func TestConformance(t *testing.T) {
	bin := os.Getenv("CONFORMANCE_BIN")
	if bin == "" {
		t.Skip("set CONFORMANCE_BIN to scripts/e2e-bin.sh's directory (make conformance)")
	}
	c := requireCluster(t)
	var names []string
	for _, s := range strings.Split(os.Getenv("CONFORMANCE_SETS"), ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if _, ok := conformanceSets[s]; !ok {
			t.Fatalf("CONFORMANCE_SETS: unknown set %q", s)
		}
		names = append(names, s)
	}
	if f := os.Getenv("CONFORMANCE_FOCUS"); f != "" {
		// A rerun of chosen specs (make conformance FOCUS=regexp).
		conformanceSets["focus"] = conformanceSet{Focus: f, Skip: skipAlways}
		names = []string{"focus"}
	}
	if len(names) == 0 {
		names = []string{"netpol", "conformance", "services"}
	}
	jobs := 1
	if v := os.Getenv("CONFORMANCE_JOBS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 4 {
			t.Fatalf("CONFORMANCE_JOBS=%q: want 1..4", v)
		}
		jobs = n
	}
	results := os.Getenv("CONFORMANCE_RESULTS")
	if results == "" {
		results = filepath.Join(c.Dir, "conformance")
	}
	if err := os.MkdirAll(results, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := c.importConformanceImages(bin); err != nil {
		t.Fatal(err)
	}

	runs := make([]setRun, len(names))
	sem := make(chan struct{}, jobs)
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			runs[i] = c.runSet(t.Context(), bin, name, filepath.Join(results, name))
		}()
	}
	wg.Wait()
	summary, failed := summarize(runs)
	if err := os.WriteFile(filepath.Join(results, "summary.md"), []byte(summary), 0o644); err != nil {
		t.Error(err)
	}
	t.Logf("results in %s\n%s", results, summary)
	if failed {
		t.Fail()
	}
}

// conformanceImages imports the conformance images once per process
// (TestConformance and TestConnectivity share them).
var conformanceImages struct {
	once sync.Once
	err  error
}

// importConformanceImages writes the images upstream's specs run (from
// bin's agnhost) and imports them into every node's containerd, once.
func (c *cluster) importConformanceImages(bin string) error {
	conformanceImages.once.Do(func() {
		imgDir, err := os.MkdirTemp("", "conformance-images")
		if err != nil {
			conformanceImages.err = err
			return
		}
		defer os.RemoveAll(imgDir)
		t0 := time.Now()
		tars, err := writeConformanceImages(filepath.Join(bin, "agnhost"), filepath.Join(built, "pause"), imgDir)
		if err != nil {
			conformanceImages.err = err
			return
		}
		for _, n := range c.nodes {
			for _, tar := range tars {
				out, err := exec.Command(c.tools["ctr"], "--address", n.sock(), "-n", "k8s.io", "images", "import", tar).CombinedOutput()
				if err != nil {
					conformanceImages.err = fmt.Errorf("node %s: import %s: %v: %s", n.name, tar, err, out)
					return
				}
			}
		}
		logf("conformance: images built and imported into %d nodes in %s", len(c.nodes), time.Since(t0).Round(time.Millisecond))
	})
	return conformanceImages.err
}

// setRun is one set's outcome.
type setRun struct {
	Name     string
	Dir      string
	Duration time.Duration
	Err      error // e2e.test's exit (non-nil when a spec failed, too)
	Cases    []junitCase
	ReadErr  error // the JUnit report could not be read
}

// runSet runs e2e.test for one set inside the control plane's network
// namespace (where the API server and the node addresses are).
func (c *cluster) runSet(ctx context.Context, bin, name, dir string) setRun {
	r := setRun{Name: name, Dir: dir}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		r.Err = err
		return r
	}
	set := conformanceSets[name]
	kubeconfig := filepath.Join(c.Dir, "admin.kubeconfig")
	args := []string{"-t", strconv.Itoa(c.cpPid), "-n", "--", filepath.Join(bin, "e2e.test"),
		"--provider=skeleton", "--kubeconfig=" + kubeconfig, "--report-dir=" + dir,
		"--ginkgo.focus=" + set.Focus, "--ginkgo.skip=" + set.Skip,
		"--ginkgo.no-color", "--ginkgo.timeout=3h", "--ginkgo.v",
		"--disable-log-dump", "--num-nodes=" + strconv.Itoa(len(c.nodes)),
	}
	if kubectl := filepath.Join(kubetest.BinDir(), "kubectl"); fileExists(kubectl) {
		args = append(args, "--kubectl-path="+kubectl)
	}
	log, err := os.Create(filepath.Join(dir, "e2e.log"))
	if err != nil {
		r.Err = err
		return r
	}
	defer log.Close()
	cmd := exec.CommandContext(ctx, c.tools["nsenter"], args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	cmd.Dir = dir
	logf("conformance: set %s: e2e.test --ginkgo.focus=%q --ginkgo.skip=%q (log %s)", name, set.Focus, set.Skip, log.Name())
	t0 := time.Now()
	r.Err = cmd.Run()
	r.Duration = time.Since(t0)
	r.Cases, r.ReadErr = readJUnit(filepath.Join(dir, "junit_01.xml"))
	logf("conformance: set %s done in %s: %v", name, r.Duration.Round(time.Second), r.Err)
	return r
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// junitCase is one spec of the suite's JUnit report (ginkgo's format:
// status passed, failed, skipped, ...; a spec the focus left out is
// "skipped" with the bare message "skipped", one the suite skipped at run
// time has "skipped - <reason>").
type junitCase struct {
	Name    string  `xml:"name,attr"`
	Status  string  `xml:"status,attr"`
	Time    float64 `xml:"time,attr"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
	Failure *struct {
		Message string `xml:"message,attr"`
		Text    string `xml:",chardata"`
	} `xml:"failure"`
	Error *struct {
		Message string `xml:"message,attr"`
		Text    string `xml:",chardata"`
	} `xml:"error"`
}

func readJUnit(path string) ([]junitCase, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc struct {
		Suites []struct {
			Cases []junitCase `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var cases []junitCase
	for _, s := range doc.Suites {
		for _, tc := range s.Cases {
			// The specs are "[It] <full text>"; the suite's setup and
			// report nodes are cases too, kept only when they failed.
			name, isSpec := strings.CutPrefix(tc.Name, "[It] ")
			if !isSpec && (tc.Status == "passed" || tc.Status == "skipped") {
				continue
			}
			tc.Name = name
			cases = append(cases, tc)
		}
	}
	return cases, nil
}

// summarize renders the runs as markdown and says whether anything
// failed (a failed spec, an e2e.test that did not write its report).
func summarize(runs []setRun) (string, bool) {
	var b strings.Builder
	failed := false
	fmt.Fprintf(&b, "# Conformance run %s\n\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "| set | passed | failed | skipped | duration |\n|---|---|---|---|---|\n")
	type line struct{ set, name, why string }
	var fails, skips []line
	var passes []string
	for _, r := range runs {
		var p, f, s int
		for _, tc := range r.Cases {
			switch {
			case tc.Status == "passed":
				p++
				passes = append(passes, fmt.Sprintf("- %s: %s (%.0fs)", r.Name, tc.Name, tc.Time))
			case tc.Status == "skipped":
				msg := ""
				if tc.Skipped != nil {
					msg = tc.Skipped.Message
				}
				if msg == "skipped" || msg == "" {
					continue // not selected
				}
				s++
				skips = append(skips, line{r.Name, tc.Name, strings.TrimPrefix(msg, "skipped - ")})
			default:
				f++
				why := tc.Status
				if tc.Failure != nil {
					why += ": " + firstLines(tc.Failure.Message+"\n"+tc.Failure.Text, 3)
				} else if tc.Error != nil {
					why += ": " + firstLines(tc.Error.Message+"\n"+tc.Error.Text, 3)
				}
				fails = append(fails, line{r.Name, tc.Name, why})
			}
		}
		if r.ReadErr != nil {
			failed = true
			fails = append(fails, line{r.Name, "(no report)", fmt.Sprintf("e2e.test: %v; report: %v (log %s)", r.Err, r.ReadErr, filepath.Join(r.Dir, "e2e.log"))})
		}
		if f > 0 {
			failed = true
		}
		if p+f+s == 0 && r.ReadErr == nil {
			failed = true
			fails = append(fails, line{r.Name, "(no spec ran)", fmt.Sprintf("the focus matched nothing (log %s)", filepath.Join(r.Dir, "e2e.log"))})
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %s |\n", r.Name, p, f, s, r.Duration.Round(time.Second))
	}
	sort.Slice(fails, func(i, j int) bool { return fails[i].name < fails[j].name })
	sort.Slice(skips, func(i, j int) bool { return skips[i].name < skips[j].name })
	fmt.Fprintf(&b, "\n## Failed\n\n")
	for _, l := range fails {
		fmt.Fprintf(&b, "- %s: %s\n  - %s\n", l.set, l.name, strings.ReplaceAll(l.why, "\n", "\n    "))
	}
	fmt.Fprintf(&b, "\n## Skipped (by the suite, with its reason)\n\n")
	for _, l := range skips {
		fmt.Fprintf(&b, "- %s: %s\n  - %s\n", l.set, l.name, l.why)
	}
	fmt.Fprintf(&b, "\n## Passed\n\n%s\n", strings.Join(passes, "\n"))
	return b.String(), failed
}

func firstLines(s string, n int) string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() && len(out) < n {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// writeConformanceImages writes the images the selected specs run, as
// docker-archive tarballs in dir (pkg/image, one layer, no registry):
//   - agnhost: upstream's /agnhost (entrypoint, "pause" by default as
//     upstream's image) with what the specs exec through it: /bin/sh and
//     the usual tools (Debian's busybox, dynamic: a static busybox's ash
//     runs its own applets, and its nc has no -u), a full nc (Debian's
//     netcat-openbsd), curl, and dig and getent for the DNS specs, each
//     with the shared libraries ldd lists (upstream's is Alpine with
//     bind-tools, curl and netcat-openbsd);
//   - busybox and jessie-dnsutils: the same files, /bin/sh by default;
//   - pause: the harness's pause program under upstream's name.
func writeConformanceImages(agnhost, pause, dir string) ([]string, error) {
	if err := image.CheckStatic(agnhost); err != nil {
		return nil, err
	}
	tools := map[string]string{ // path in the image -> host program
		"/bin/busybox":    "/bin/busybox",
		"/usr/bin/nc":     "/bin/nc.openbsd",
		"/usr/bin/curl":   "/usr/bin/curl",
		"/usr/bin/dig":    "/usr/bin/dig",
		"/usr/bin/getent": "/usr/bin/getent",
	}
	for _, p := range tools {
		if !fileExists(p) {
			return nil, fmt.Errorf("%s missing: apt-get install busybox netcat-openbsd curl bind9-dnsutils", p)
		}
	}
	// porter's TLS ports read localhost.crt and .key from the working
	// directory, /; some specs run agnhost as agnhost-2.
	files := []image.File{{Path: "/agnhost", Mode: 0o755, Source: agnhost}, {Path: "/agnhost-2", Link: "agnhost"},
		{Path: "/localhost.crt", Source: filepath.Join(filepath.Dir(agnhost), "localhost.crt")},
		{Path: "/localhost.key", Source: filepath.Join(filepath.Dir(agnhost), "localhost.key")}}
	libs := map[string]bool{}
	for in, host := range tools {
		files = append(files, image.File{Path: in, Mode: 0o755, Source: host})
		deps, err := sharedLibs(host)
		if err != nil {
			return nil, err
		}
		for _, l := range deps {
			libs[l] = true
		}
	}
	for l := range libs {
		src, err := filepath.EvalSymlinks(l)
		if err != nil {
			return nil, fmt.Errorf("library %s: %w", l, err)
		}
		files = append(files, image.File{Path: l, Mode: 0o755, Source: src})
	}
	list, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list: %w", err)
	}
	for _, a := range strings.Fields(string(list)) {
		if a == "busybox" || a == "nc" || a == "curl" || strings.Contains(a, "/") {
			continue
		}
		files = append(files, image.File{Path: "/bin/" + a, Link: "busybox"})
	}
	files = append(files, image.File{Path: "/tmp/.keep", Data: []byte{}})
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	specs := []image.Spec{
		{Ref: agnhostRef, Files: files, Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}, Env: env},
		{Ref: busyboxRef, Files: files, Cmd: []string{"/bin/sh"}, Env: env},
		{Ref: jessieRef, Files: files, Cmd: []string{"/bin/sh"}, Env: env},
		{Ref: pauseRef, Files: []image.File{{Path: "/pause", Mode: 0o755, Source: pause}}, Entrypoint: []string{"/pause"}, User: "65535:65535"},
	}
	var tars []string
	for i, s := range specs {
		out := filepath.Join(dir, fmt.Sprintf("image-%d.tar", i))
		if _, err := image.Write(s, out); err != nil {
			return nil, err
		}
		tars = append(tars, out)
	}
	return tars, nil
}

// lddPath matches the absolute paths in ldd's output ("libc.so.6 =>
// /lib/x86_64-linux-gnu/libc.so.6 (0x...)", "/lib64/ld-linux-x86-64.so.2
// (0x...)"); linux-vdso has none.
var lddPath = regexp.MustCompile(`(?m)(?:=>\s*|^\s*)(/\S+)\s+\(0x`)

// sharedLibs lists the shared libraries (and the loader) program links.
func sharedLibs(program string) ([]string, error) {
	out, err := exec.Command("ldd", program).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", program, err)
	}
	var libs []string
	for _, m := range lddPath.FindAllStringSubmatch(string(out), -1) {
		libs = append(libs, m[1])
	}
	if len(libs) == 0 {
		return nil, fmt.Errorf("ldd %s: no libraries in %q", program, out)
	}
	return libs, nil
}
