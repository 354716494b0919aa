package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

func (a *app) serviceCommand() *cobra.Command {
	cmd := group(&cobra.Command{Use: "service", Short: "The service table: frontends translated to backends in BPF"}, nil)
	var maps bool
	list := &cobra.Command{
		Use: "list", Aliases: []string{"ls"}, Short: "List frontends, backends and state (--maps: what the BPF maps hold)", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			l, err := a.c.Services(ctx, maps)
			if err != nil || a.output != "table" {
				return a.printOr(l, err)
			}
			cols := []string{"FRONTEND", "KIND", "NAME", "ID", "STATE", "BACKENDS"}
			if maps {
				cols = append(cols, "IN MAPS")
			}
			t := newTable(a.out, cols...)
			for _, s := range l.Services {
				name := s.Name
				if s.PortName != "" {
					name += ":" + s.PortName
				}
				row := []any{s.Frontend, s.Kind, name, s.ID, s.State, orNone(strings.Join(s.Backends, ","))}
				if maps {
					in := "-"
					if s.Realized != nil {
						in = orNone(strings.Join(s.Realized.Backends, ","))
						if s.Realized.External {
							in += " (uplinks)"
						}
					}
					row = append(row, in)
				}
				t.row(row...)
			}
			if err := t.flush(); err != nil {
				return err
			}
			if l.Maps != nil {
				fmt.Fprintf(a.out, "maps: %d frontends, %d backend slots, %d connections, %d reverse NAT, %d affinity entries\n",
					l.Maps.Frontends, l.Maps.Backends, l.Maps.Connections, l.Maps.ReverseNAT, l.Maps.Affinity)
				printHooks(a.out, l.Maps)
			}
			if l.MapsError != "" {
				fmt.Fprintf(a.out, "maps: %s\n", l.MapsError)
			}
			return nil
		},
	}
	list.Flags().BoolVar(&maps, "maps", false, "read the BPF service maps back too")
	cmd.AddCommand(list)
	return cmd
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// printHooks prints the kube-proxy-free mode's state.
func printHooks(w io.Writer, m *models.ServiceMapCounts) {
	h := m.Hooks
	if !h.KubeProxyReplacement {
		fmt.Fprintln(w, "kube-proxy replacement: off (no socket or uplink programs attached)")
		return
	}
	fmt.Fprintf(w, "kube-proxy replacement: socket programs %s on cgroup %s; NodePort program on %s\n",
		strings.Join(h.SocketPrograms, ","), h.Cgroup, orNone(strings.Join(h.Devices, ",")))
	fmt.Fprintf(w, "maps: %d NodePort connections, %d SNAT reply entries, %d socket translations\n",
		m.NodePortNAT, m.NodePortSNAT, m.Sockets)
}
