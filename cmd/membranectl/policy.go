package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// errNothingToDelete: policy delete needs exactly one of NAME and --labels.
var errNothingToDelete = errors.New("policy delete: give a NAME (namespace/name) or --labels, not both")

func (a *app) policyCommand() *cobra.Command {
	cmd := group(&cobra.Command{Use: "policy", Short: "The policy repository"}, nil)
	cmd.AddCommand(a.policyImport(), a.policyGet(), a.policyDelete())
	return cmd
}

func (a *app) policyImport() *cobra.Command {
	var format string
	imp := &cobra.Command{
		Use: "import FILE|-", Short: "Import policy documents (YAML or JSON; - reads stdin)", Args: exactArgs(1, "FILE or -"),
		RunE: func(cmd *cobra.Command, args []string) error {
			doc, ctype, err := readPolicy(args[0], format, cmd.InOrStdin())
			if err != nil {
				return err
			}
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			res, err := a.c.PolicyImport(ctx, doc, ctype)
			if err != nil || a.output != "table" {
				return a.printOr(res, err)
			}
			fmt.Fprintf(a.out, "revision %d: imported %s\n", res.Revision, strings.Join(res.Policies, ", "))
			return nil
		},
	}
	imp.Flags().StringVar(&format, "format", "", "yaml or json (default: from the file extension, else yaml)")
	return imp
}

func (a *app) policyGet() *cobra.Command {
	return &cobra.Command{
		Use: "get", Aliases: []string{"list", "ls"}, Short: "List the imported policies", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			pl, err := a.c.PolicyList(ctx)
			if err != nil || a.output != "table" {
				return a.printOr(pl, err)
			}
			fmt.Fprintf(a.out, "revision %d\n", pl.Revision)
			t := newTable(a.out, "NAMESPACE", "NAME", "KIND")
			for _, p := range pl.Policies {
				t.row(p.Namespace, p.Name, p.Kind)
			}
			if err := t.flush(); err != nil {
				return err
			}
			return printSelections(a.out, pl.Policies)
		},
	}
}

func (a *app) policyDelete() *cobra.Command {
	var labels string
	del := &cobra.Command{
		Use: "delete [NAMESPACE/NAME]", Short: "Delete policies by name or by --labels k=v,...",
		RunE: func(cmd *cobra.Command, args []string) error {
			name := ""
			if len(args) > 1 {
				return usageError{errNothingToDelete}
			}
			if len(args) == 1 {
				name = args[0]
			}
			if (name == "") == (labels == "") {
				return usageError{errNothingToDelete}
			}
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			res, err := a.c.PolicyDeleteMatching(ctx, name, labels)
			if err != nil || a.output != "table" {
				return a.printOr(res, err)
			}
			fmt.Fprintf(a.out, "revision %d: deleted %d\n", res.Revision, res.Deleted)
			return nil
		},
	}
	del.Flags().StringVar(&labels, "labels", "", "delete the policies with these labels, e.g. app=web,team=a")
	return del
}

// readPolicy reads a policy file (or stdin for "-") and picks its
// Content-Type from --format or the extension.
func readPolicy(path, format string, stdin io.Reader) ([]byte, string, error) {
	var (
		doc []byte
		err error
	)
	if path == "-" {
		doc, err = io.ReadAll(stdin)
	} else {
		doc, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, "", fmt.Errorf("policy import: %w", err)
	}
	if format == "" {
		format = "yaml"
		if strings.EqualFold(filepath.Ext(path), ".json") {
			format = "json"
		}
	}
	switch format {
	case "yaml":
		return doc, "application/yaml", nil
	case "json":
		return doc, "application/json", nil
	}
	return nil, "", usageError{fmt.Errorf("--format: %q: want yaml or json", format)}
}

// printSelections lists what each policy's toServices and entity peers
// select now, below the table.
func printSelections(w io.Writer, pols []*models.Policy) error {
	for _, p := range pols {
		for _, s := range p.Selected {
			ids := make([]string, len(s.Identities))
			for i, id := range s.Identities {
				ids[i] = strconv.FormatUint(uint64(id), 10)
			}
			line := fmt.Sprintf("%s/%s %s: identities [%s]", p.Namespace, p.Name, s.Selector, strings.Join(ids, " "))
			for _, svc := range s.Services {
				if len(svc.Selector) > 0 {
					keys := slices.Sorted(maps.Keys(svc.Selector))
					kv := make([]string, len(keys))
					for i, k := range keys {
						kv[i] = k + "=" + svc.Selector[k]
					}
					line += fmt.Sprintf(", service %s/%s selector %s", svc.Namespace, svc.Name, strings.Join(kv, ","))
				} else {
					line += fmt.Sprintf(", service %s/%s addresses [%s]", svc.Namespace, svc.Name, strings.Join(svc.Addresses, " "))
				}
			}
			if _, err := fmt.Fprintln(w, line); err != nil {
				return err
			}
		}
	}
	return nil
}
