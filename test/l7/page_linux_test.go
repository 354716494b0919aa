package l7

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// chromium finds Debian's chromium (apt-get install chromium); under CI
// its absence is a failure.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if testutil.InCI() {
		t.Fatal("no chromium: apt-get install chromium (.ci/run does)")
	}
	t.Skip("no chromium: apt-get install chromium")
	return ""
}

// TestFlowsPage drives the agent's flows page (/ui/) in a real headless
// chromium (issue 37): with real traffic on a node with the Linux
// datapath — a to b forwarded, c to b dropped by a policy — the page's
// table shows both verdicts with the pods, its service map has the edge
// c -> b with its drops and the edge a -> b without, and the from-pod
// filter typed into the form narrows the table to c's flows. A
// screenshot of the page is kept in bin/artifacts/flows-page.png.
func TestFlowsPage(t *testing.T) {
	browser := chromium(t)
	n := newFlowsNode(t)
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	n.importPolicy(ingressL4) // b admits a only, on port 80
	t.Cleanup(func() { n.t = t; n.deletePolicy("default/b-http") })
	testutil.Eventually(t, "c's connection to b dropped", func() bool {
		_, _, err := c.request(b, "GET", "/", dropTimeout)
		return err != nil
	})
	if code, _, err := a.request(b, "GET", "/", okTimeout); err != nil || code != 200 {
		t.Fatalf("a -> b: %d %v", code, err)
	}
	n.waitFlows("the flows", url.Values{"to-pod": {"default/b"}}, func(f []models.Flow) bool {
		var fwd, drop bool
		for _, x := range f {
			fwd = fwd || (x.Source.Pod == "a" && x.Verdict == "forwarded")
			drop = drop || (x.Source.Pod == "c" && x.Verdict == "dropped")
		}
		return fwd && drop
	})

	// The page through the agent's API socket, served on loopback as the
	// agent's read-only HTTP listener would (same origin for its fetches).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.Out.URL.Scheme, r.Out.URL.Host = "http", "membrane" },
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", n.socket)
		}},
	}
	srv := &http.Server{Handler: rp, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	page := "http://" + ln.Addr().String() + "/ui/"

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.WindowSize(1600, 1000), chromedp.UserDataDir(t.TempDir()))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()

	type snapshot struct {
		Rows  []map[string]string `json:"rows"`
		Edges []map[string]string `json:"edges"`
	}
	if err := chromedp.Do(bctx,
		chromedp.Navigate(page),
		chromedp.WaitVisible(chromedp.CSS(`#flows tr[data-verdict="dropped"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#map g.edge.drops`)),
	); err != nil {
		t.Fatalf("load the page %s: %v", page, err)
	}
	snap, err := chromedp.Run(bctx, chromedp.Evaluate[snapshot](`({
		rows: [...document.querySelectorAll("#flows tr")].map(r => ({verdict: r.dataset.verdict, source: r.dataset.source, destination: r.dataset.destination})),
		edges: [...document.querySelectorAll("#map g.edge")].map(g => ({from: g.dataset.from, to: g.dataset.to, drops: g.dataset.drops, forwarded: g.dataset.forwarded}))
	})`))
	if err != nil {
		t.Fatalf("read the page: %v", err)
	}
	rows, edges := snap.Rows, snap.Edges
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	artifact := filepath.Join(kubetest.RepoRoot(), "bin", "artifacts", "flows-page.png")
	if err := os.MkdirAll(filepath.Dir(artifact), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(artifact, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes); %d rows, edges %v", artifact, len(png), len(rows), edges)

	var fwdRow, dropRow bool
	for _, r := range rows {
		fwdRow = fwdRow || (r["verdict"] == "forwarded" && r["source"] == "default/a" && r["destination"] == "default/b")
		dropRow = dropRow || (r["verdict"] == "dropped" && r["source"] == "default/c" && r["destination"] == "default/b")
	}
	if !fwdRow || !dropRow {
		t.Errorf("table rows %v: want a forwarded a -> b and a dropped c -> b", rows)
	}
	var cb, ab bool
	for _, e := range edges {
		if strings.HasSuffix(e["from"], "app=c") && strings.HasSuffix(e["to"], "app=b") && e["drops"] != "0" {
			cb = true
		}
		if strings.HasSuffix(e["from"], "app=a") && strings.HasSuffix(e["to"], "app=b") && e["forwarded"] != "0" && e["drops"] == "0" {
			ab = true
		}
	}
	if !cb || !ab {
		t.Errorf("service map edges %v: want c -> b with drops and a -> b forwarded without", edges)
	}

	// The filter form: only c's flows remain.
	if err := chromedp.Do(bctx, chromedp.SendKeys(chromedp.CSS(`input[name="from-pod"]`), "default/c")); err != nil {
		t.Fatalf("type a filter: %v", err)
	}
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`(() => { const r = [...document.querySelectorAll("#flows tr")]; return r.length > 0 && r.every(x => x.dataset.source === "default/c"); })()`,
		chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		sources, _ := chromedp.Run(bctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#flows tr")].map(r => r.dataset.source)`))
		t.Fatalf("filter by from-pod: %v (sources %v)", err, sources)
	}
}
