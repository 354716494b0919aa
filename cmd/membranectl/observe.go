package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// observeCommand is `membranectl observe`, Hubble's observe on one node:
// the flow log's flows, filtered by the agent, one line each.
func (a *app) observeCommand() *cobra.Command {
	var fromPod, toPod, fromLabel, toLabel, namespace, verdict, protocol []string
	var ports []int
	var last int
	var since string
	var follow, allNodes bool
	var k kubeFlags
	cmd := &cobra.Command{
		Use:   "observe",
		Short: "Show the node's flows: connections with their verdicts, drops, L7 and DNS records (-f follows)",
		Long: "observe prints the agent's flow log (GET /v1/flows), one line per flow:\n" +
			"  TIME NODE: SOURCE -> DESTINATION PROTO VERDICT [flags] [details]\n" +
			"a side is namespace/pod:port (address:port when not a pod) with its identity. Filters of one\n" +
			"flag are alternatives, different flags must all match. -o json prints one JSON flow per line.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := url.Values{}
			for _, p := range []struct {
				key  string
				vals []string
			}{{"from-pod", fromPod}, {"to-pod", toPod}, {"from-label", fromLabel}, {"to-label", toLabel},
				{"namespace", namespace}, {"verdict", verdict}, {"protocol", protocol}} {
				for _, v := range p.vals {
					q.Add(p.key, v)
				}
			}
			for _, p := range ports {
				q.Add("port", strconv.Itoa(p))
			}
			if last > 0 {
				q.Set("last", strconv.Itoa(last))
			}
			if since != "" {
				q.Set("since", since)
			}
			if allNodes {
				return a.observeAllNodes(cmd, &k, q, follow)
			}
			if follow {
				return a.followFlows(cmd, q)
			}
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			resp, err := a.c.Flows(ctx, q)
			if err != nil {
				return err
			}
			for _, fl := range resp.Flows {
				if err := a.printFlow(fl); err != nil {
					return err
				}
			}
			if l := lossText(resp.Stats); l != "" {
				fmt.Fprintf(a.errOut, "membranectl: %s\n", l)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&fromPod, "from-pod", nil, "source pod: [namespace/]pod (prefix of the name; namespace default)")
	f.StringSliceVar(&toPod, "to-pod", nil, "destination pod: [namespace/]pod")
	f.StringSliceVar(&fromLabel, "from-label", nil, "source label: key, key=value or source:key=value")
	f.StringSliceVar(&toLabel, "to-label", nil, "destination label")
	f.StringSliceVar(&namespace, "namespace", nil, "either side's namespace")
	f.StringSliceVar(&verdict, "verdict", nil, "forwarded, redirected, dropped, audit, translated (a Service translated it); allowed, denied, error (L7, DNS)")
	f.StringSliceVar(&protocol, "protocol", nil, "tcp, udp, sctp, icmp, icmpv6")
	f.IntSliceVar(&ports, "port", nil, "either side's port")
	f.IntVar(&last, "last", 0, "only the last N matching flows (0: all the agent holds)")
	f.StringVar(&since, "since", "", "only flows since a time (RFC 3339) or for a duration back (5m)")
	f.BoolVarP(&follow, "follow", "f", false, "follow new flows (Ctrl-C ends it)")
	f.BoolVar(&allNodes, "all-nodes", false, "every node's flows, through the API server (pods/exec into the DaemonSet's pods)")
	k.register(cmd)
	return cmd
}

// followFlows prints the stored flows and then each new one.
func (a *app) followFlows(cmd *cobra.Command, q url.Values) error {
	ctx, cancel := context.WithCancel(cmd.Context())
	if cmd.Flags().Changed("timeout") {
		ctx, cancel = a.ctx(cmd)
	}
	defer cancel()
	var perr error
	err := a.c.FollowFlows(ctx, q, func(fl models.Flow) bool {
		perr = a.printFlow(fl)
		return perr == nil
	})
	if perr != nil {
		return perr
	}
	return err
}

// printFlow writes one flow: a line (table), a JSON line, or a YAML
// document.
func (a *app) printFlow(fl models.Flow) error {
	switch a.output {
	case "json":
		b, err := json.Marshal(fl)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.out, "%s\n", b)
		return err
	case "yaml":
		if _, err := fmt.Fprintln(a.out, "---"); err != nil {
			return err
		}
		return a.print(fl)
	}
	_, err := fmt.Fprintln(a.out, flowText(fl))
	return err
}

// flowText is a flow's line, in the spirit of hubble observe's:
// "Dec 06 22:35:40.331 node: default/a:49072 (1001) -> default/b:8080
// (1002) TCP FORWARDED egress SYN policy=default/allow".
func flowText(fl models.Flow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s", fl.Time.UTC().Format("Jan 02 15:04:05.000"))
	if fl.Node != "" {
		fmt.Fprintf(&b, " %s", fl.Node)
	}
	fmt.Fprintf(&b, ": %s -> %s", sideText(fl.Source), sideText(fl.Destination))
	if fl.Protocol != "" {
		fmt.Fprintf(&b, " %s", fl.Protocol)
	}
	fmt.Fprintf(&b, " %s", strings.ToUpper(fl.Verdict))
	if fl.Type != "l3-l4" {
		fmt.Fprintf(&b, " (%s)", strings.ToUpper(fl.Type))
	}
	if fl.Direction != "" {
		fmt.Fprintf(&b, " %s", fl.Direction)
	}
	if len(fl.TCPFlags) > 0 {
		fmt.Fprintf(&b, " %s", strings.Join(fl.TCPFlags, ","))
	}
	if fl.DropReason != "" {
		fmt.Fprintf(&b, " reason=%s", fl.DropReason)
	}
	if fl.Service != "" {
		svc := fl.Service
		if fl.ServiceName != "" {
			svc = fl.ServiceName + "@" + svc
		}
		fmt.Fprintf(&b, " service=%s", svc)
	}
	if fl.ProxyPort != 0 {
		fmt.Fprintf(&b, " proxy-port=%d", fl.ProxyPort)
	}
	if len(fl.Policies) > 0 {
		fmt.Fprintf(&b, " policy=%s (%s)", strings.Join(fl.Policies, ","), fl.PolicyMatch)
	}
	if l := fl.L7; l != nil {
		fmt.Fprintf(&b, " http=%s %s%s %s", l.Method, l.Host, l.Path, l.Verdict)
		if l.Code != 0 {
			fmt.Fprintf(&b, " %d", l.Code)
		}
	}
	if d := fl.DNS; d != nil {
		fmt.Fprintf(&b, " dns=%s %s %s", d.Query, d.QType, d.Verdict)
		if d.RCode != "" {
			fmt.Fprintf(&b, " %s", d.RCode)
		}
		if len(d.IPs) > 0 {
			fmt.Fprintf(&b, " %s", strings.Join(d.IPs, ","))
		}
	}
	return b.String()
}

// sideText is "namespace/pod:port (identity)", or "address:port
// (identity)" for a side that is not a local or known pod.
func sideText(p models.FlowPeer) string {
	port := ""
	if p.Port != 0 {
		port = strconv.Itoa(int(p.Port))
	}
	var s string
	switch {
	case p.Pod != "":
		s = p.Namespace + "/" + p.Pod
		if port != "" {
			s += ":" + port
		}
	case p.IP != "" && port != "":
		s = net.JoinHostPort(p.IP, port)
	case p.IP != "":
		s = p.IP
	default:
		s = "?"
	}
	if p.Identity != 0 {
		s += fmt.Sprintf(" (%d)", p.Identity)
	}
	return s
}

// lossText says what the flow log lost, "" if nothing.
func lossText(st models.FlowStats) string {
	var parts []string
	for _, c := range []struct {
		n    uint64
		what string
	}{{st.DatapathLost, "flow reports lost in the kernel ring"}, {st.DropsLost, "drop notifications lost in the kernel ring"},
		{st.RateLimited, "flows over --flows-rate"}, {st.FollowerLost, "flows missed by dropped followers"}} {
		if c.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", c.n, c.what))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "lost: " + strings.Join(parts, ", ")
}

// flowsText is the status line of the flow log.
func flowsText(st *models.FlowStats) string {
	on := "off (drops only)"
	if st.Enabled {
		on = "on"
	}
	s := fmt.Sprintf("%s, %d seen, %d/%d buffered, %d followers", on, st.Seen, st.Buffered, st.Capacity, st.Followers)
	if l := lossText(*st); l != "" {
		s += "; " + l
	}
	return s
}
