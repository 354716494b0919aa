package kubetest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The chart renderer (tools/chart, a module of its own so the Helm SDK
// stays out of the main module), built once per test process into a
// temporary directory RemoveChartTool removes (Main calls it).
var (
	chartMu   sync.Mutex
	chartOnce = &sync.Once{}
	chartDir  string
	chartBin  string
	chartErr  error
)

// RemoveChartTool removes the renderer RenderChart built, if any; a test
// package using RenderChart without Main calls it from its TestMain.
func RemoveChartTool() {
	chartMu.Lock()
	defer chartMu.Unlock()
	if chartDir != "" {
		_ = os.RemoveAll(chartDir)
	}
	chartDir, chartBin, chartErr, chartOnce = "", "", nil, &sync.Once{}
}

func chartTool() (string, error) {
	chartMu.Lock()
	defer chartMu.Unlock()
	chartOnce.Do(func() {
		dir, err := os.MkdirTemp("", "membrane-chart-")
		if err != nil {
			chartErr = err
			return
		}
		chartDir, chartBin = dir, filepath.Join(dir, "chart")
		cmd := exec.Command("go", "build", "-o", chartBin, ".")
		cmd.Dir = filepath.Join(RepoRoot(), "tools", "chart")
		if out, err := cmd.CombinedOutput(); err != nil {
			chartErr = fmt.Errorf("build tools/chart: %w\n%s", err, out)
		}
	})
	return chartBin, chartErr
}

// RenderChart renders deploy/helm/membrane with the Helm Go SDK
// (tools/chart render) for a release in namespace with Helm's --set
// expressions, and returns the error text of a refused render as err.
func RenderChart(namespace string, sets ...string) ([]*unstructured.Unstructured, error) {
	bin, err := chartTool()
	if err != nil {
		return nil, err
	}
	args := []string{"render", "-chart", filepath.Join(RepoRoot(), "deploy", "helm", "membrane"), "-namespace", namespace}
	for _, s := range sets {
		args = append(args, "-set", s)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%v: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	return ReadObjects(stdout.Bytes())
}

// MustRenderChart is RenderChart failing tb on an error.
func MustRenderChart(tb testing.TB, namespace string, sets ...string) []*unstructured.Unstructured {
	tb.Helper()
	objs, err := RenderChart(namespace, sets...)
	if err != nil {
		tb.Fatalf("render chart %v: %v", sets, err)
	}
	return objs
}
