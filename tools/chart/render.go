package main

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/strvals"
	"sigs.k8s.io/yaml"
)

// Release is what a render needs besides the chart's values: the
// release's name and namespace, as `helm install NAME -n NAMESPACE`.
type Release struct {
	Name, Namespace string
}

// DefaultRelease is the install the docs and the plain manifests use.
var DefaultRelease = Release{Name: "membrane", Namespace: "membrane-system"}

// File is one rendered file of the chart: the CRDs of crds/ (one File
// each) or the documents of one template, in the template's order.
type File struct {
	// Name is the file's name in the chart ("crds/x.yaml",
	// "templates/membrane.yaml").
	Name string
	// Docs are its non-empty YAML documents, without "---".
	Docs []string
}

// ChartDir is deploy/helm/membrane relative to this module's directory.
const ChartDir = "../../deploy/helm/membrane"

// Load loads the chart at dir (its crds/ is a symlink to deploy/crds,
// which the loader follows).
func Load(dir string) (*chart.Chart, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("load chart %s: %w", dir, err)
	}
	return ch, nil
}

// ParseValues turns --set expressions (Helm's syntax: a.b=c,d[0]=e) and
// values files into one value tree, files first, then the expressions in
// order, as helm does.
func ParseValues(files, sets []string) (map[string]any, error) {
	vals := map[string]any{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("values: %w", err)
		}
		m := map[string]any{}
		if err := yaml.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("values %s: %w", f, err)
		}
		vals = chartutil.MergeTables(m, vals)
	}
	for _, s := range sets {
		if err := strvals.ParseInto(s, vals); err != nil {
			return nil, fmt.Errorf("values: --set %s: %w", s, err)
		}
	}
	return vals, nil
}

// emptyDoc matches a document holding nothing but comments and blanks.
var emptyDoc = regexp.MustCompile(`^(\s*(#[^\n]*)?\n?)*$`)

// Render renders ch with vals (over the chart's defaults) for rel, as
// `helm template --include-crds` does: the CRDs first, one File each in
// name order, then every template's documents, templates in name order
// (a template renders its objects in the order it lists them). A value the
// chart refuses fails with the template's message.
func Render(ch *chart.Chart, vals map[string]any, rel Release) ([]File, error) {
	top, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{
		Name: rel.Name, Namespace: rel.Namespace, IsInstall: true, Revision: 1,
	}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	out, err := engine.Render(ch, top)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	var files []File
	for _, crd := range ch.CRDObjects() {
		files = append(files, File{Name: "crds/" + path.Base(crd.Filename), Docs: splitDocs(string(crd.File.Data))})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	prefix := ch.Name() + "/"
	var names []string
	for name := range out {
		if strings.HasSuffix(name, ".yaml") && !strings.HasPrefix(path.Base(name), "_") {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		docs := splitDocs(out[name])
		if len(docs) > 0 {
			files = append(files, File{Name: strings.TrimPrefix(name, prefix), Docs: docs})
		}
	}
	return files, nil
}

// docSep separates the documents of a YAML stream.
var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// splitDocs splits a YAML stream into its documents, in order, dropping
// those that hold only comments; each ends with exactly one newline.
func splitDocs(s string) []string {
	var docs []string
	for _, d := range docSep.Split(s, -1) {
		if emptyDoc.MatchString(d) {
			continue
		}
		docs = append(docs, strings.TrimRight(strings.TrimLeft(d, "\n"), " \n")+"\n")
	}
	return docs
}

// Stream is files as one YAML stream ("---" between documents).
func Stream(files []File) string {
	var b strings.Builder
	for _, f := range files {
		for _, d := range f.Docs {
			if b.Len() > 0 {
				b.WriteString("---\n")
			}
			b.WriteString(d)
		}
	}
	return b.String()
}

// chartDirFrom resolves the chart directory: dir if given, else ChartDir
// relative to this source's module (go run from the repository root or
// from tools/chart).
func chartDirFrom(dir string) string {
	if dir != "" {
		return dir
	}
	for _, c := range []string{ChartDir, "deploy/helm/membrane"} {
		if _, err := os.Stat(filepath.Join(c, "Chart.yaml")); err == nil {
			return c
		}
	}
	return ChartDir
}
