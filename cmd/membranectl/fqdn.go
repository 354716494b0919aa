package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/membrane-cni/membrane/pkg/domain/events"
)

// fqdnCommand is `membranectl fqdn list` (Cilium's `cilium fqdn cache
// list`): the names endpoints resolved through the DNS proxy.
func (a *app) fqdnCommand() *cobra.Command {
	cmd := group(&cobra.Command{Use: "fqdn", Short: "Names learned from DNS answers (toFQDNs policy)"}, nil)
	var (
		ep      int
		pattern string
	)
	list := &cobra.Command{
		Use: "list", Aliases: []string{"ls"}, Short: "List the learned names per endpoint with their addresses and TTL", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			entries, err := a.c.FQDNCache(ctx, ep, pattern)
			if err != nil || a.output != "table" {
				return a.printOr(entries, err)
			}
			t := newTable(a.out, "ENDPOINT", "FQDN", "IP", "TTL", "EXPIRATION")
			for _, e := range entries {
				t.row(e.Endpoint, e.FQDN, e.IP, e.TTL, e.ExpirationTime.UTC().Format(time.RFC3339))
			}
			return t.flush()
		},
	}
	list.Flags().IntVarP(&ep, "endpoint", "e", -1, "only this endpoint's names")
	list.Flags().StringVarP(&pattern, "matchpattern", "p", "", "only names matching this toFQDNs matchPattern")
	cmd.AddCommand(list)
	return cmd
}

// dnsText renders a dns-query event's query and verdict.
func dnsText(d *events.DNS) string {
	s := fmt.Sprintf("query=%s qtype=%s verdict=%s", d.Query, d.QType, d.Verdict)
	if d.RCode != "" {
		s += " rcode=" + d.RCode
	}
	if d.Server != "" {
		s += " server=" + d.Server
	}
	if len(d.IPs) > 0 {
		s += fmt.Sprintf(" ips=%s ttl=%d", strings.Join(d.IPs, ","), d.TTL)
	}
	if d.Error != "" {
		s += fmt.Sprintf(" error=%q", d.Error)
	}
	return s
}
