package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"sigs.k8s.io/yaml"
)

// print writes v as JSON or YAML (table: YAML, for single objects).
func (a *app) print(v any) error {
	if a.output == "json" {
		enc := json.NewEncoder(a.out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	b, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Errorf("yaml: %w", err)
	}
	_, err = a.out.Write(b)
	return err
}

// printOr prints v unless err is set.
func (a *app) printOr(v any, err error) error {
	if err != nil {
		return err
	}
	return a.print(v)
}

// table writes rows under a header, columns aligned with two spaces as
// `cilium endpoint list` does; empty cells print as "-".
type table struct {
	tw *tabwriter.Writer
}

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	fmt.Fprintln(t.tw, strings.Join(header, "\t"))
	return t
}

func (t *table) row(cells ...any) {
	s := make([]string, len(cells))
	for i, c := range cells {
		s[i] = fmt.Sprint(c)
		if s[i] == "" {
			s[i] = "-"
		}
	}
	fmt.Fprintln(t.tw, strings.Join(s, "\t"))
}

func (t *table) flush() error { return t.tw.Flush() }

func shortID(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}
