package main

import (
	"strings"

	"github.com/spf13/cobra"
)

func (a *app) nodeCommand() *cobra.Command {
	cmd := group(&cobra.Command{Use: "node", Short: "The remote nodes this agent routes to"}, nil)
	cmd.AddCommand(&cobra.Command{
		Use: "list", Aliases: []string{"ls"}, Short: "List remote nodes per source", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			nodes, err := a.c.Nodes(ctx)
			if err != nil || a.output != "table" {
				return a.printOr(nodes, err)
			}
			t := newTable(a.out, "NAME", "SOURCE", "ADDRESSES", "POD CIDRS", "ACTIVE")
			for _, n := range nodes {
				t.row(n.Name, n.Source, strings.Join(n.Addresses, ","), strings.Join(n.PodCIDRs, ","), n.Active)
			}
			return t.flush()
		},
	})
	return cmd
}
