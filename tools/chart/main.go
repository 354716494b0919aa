// Command chart renders Membrane's Helm chart (deploy/helm/membrane) with
// the Helm Go SDK (helm.sh/helm/v3; no helm binary):
//
//	go run ./tools/chart render [-f values.yaml] [-set a.b=c]... [-namespace ns]
//	go run ./tools/chart manifests [-out deploy/kubernetes] [-check]
//
// render prints every object (CRDs first) as one YAML stream, or the
// chart's refusal of the values on stderr (exit 1); manifests writes the
// plain manifests of the chart's defaults (make manifests), or with
// -check fails when the committed ones differ.
//
// A module of its own: in the main module helm.sh/helm/v3 would raise the
// agent's own dependencies (prometheus/client_golang, otel, genproto).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"strings"
)

func main() {
	// Helm's loader logs (std log) that crds/ is a symlink to deploy/crds:
	// on purpose, one copy of the CRDs.
	log.SetOutput(io.Discard)
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// multi is a repeatable string flag.
type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: chart render|manifests [flags]")
		return 2
	}
	var err error
	switch args[0] {
	case "render":
		err = runRender(args[1:], stdout, stderr)
	case "manifests":
		err = runManifests(args[1:], stderr)
	default:
		fmt.Fprintf(stderr, "chart: unknown command %q: want render or manifests\n", args[0])
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "chart %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

func runRender(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("chart render", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var files, sets multi
	fs.Var(&files, "f", "values file (repeatable)")
	fs.Var(&sets, "set", "value, Helm's --set syntax (repeatable)")
	dir := fs.String("chart", "", "chart directory (default: deploy/helm/membrane)")
	ns := fs.String("namespace", DefaultRelease.Namespace, "the release's namespace")
	if err := fs.Parse(args); err != nil {
		return err
	}
	vals, err := ParseValues(files, sets)
	if err != nil {
		return err
	}
	ch, err := Load(chartDirFrom(*dir))
	if err != nil {
		return err
	}
	out, err := Render(ch, vals, Release{Name: DefaultRelease.Name, Namespace: *ns})
	if err != nil {
		return err
	}
	_, err = io.WriteString(stdout, Stream(out))
	return err
}

func runManifests(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("chart manifests", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("chart", "", "chart directory (default: deploy/helm/membrane)")
	out := fs.String("out", "", "directory of the plain manifests (default: deploy/kubernetes beside the chart)")
	check := fs.Bool("check", false, "compare instead of writing; fail when they differ")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cd := chartDirFrom(*dir)
	if *out == "" {
		*out = cd + "/../../kubernetes"
	}
	ch, err := Load(cd)
	if err != nil {
		return err
	}
	files, err := ManifestFiles(ch, DefaultRelease)
	if err != nil {
		return err
	}
	if *check {
		return CheckManifests(*out, files)
	}
	return WriteManifests(*out, files)
}
