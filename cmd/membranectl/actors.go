package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/events"
)

func (a *app) actorsCommand() *cobra.Command {
	var kind, state, stuck string
	var minMailbox int
	cmd := &cobra.Command{
		Use: "actors", Short: "The actor tree with state, operation and mailbox depth", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := url.Values{}
			for k, v := range map[string]string{"kind": kind, "state": state, "stuck": stuck} {
				if v != "" {
					q.Set(k, v)
				}
			}
			if minMailbox > 0 {
				q.Set("min-mailbox", strconv.Itoa(minMailbox))
			}
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			list, err := a.c.Actors(ctx, q)
			if err != nil || a.output != "table" {
				if list == nil && err == nil {
					list = []*models.Actor{}
				}
				return a.printOr(list, err)
			}
			return a.actorTable(list)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kind, "kind", "", "agent, datapath, ipam, identity, endpoints or endpoint")
	f.StringVar(&state, "state", "", "actor state (an endpoint state, or running)")
	f.IntVar(&minMailbox, "min-mailbox", 0, "only actors with at least this many queued messages")
	f.StringVar(&stuck, "stuck", "", "only actors busy for longer than this, e.g. 30s")
	_ = cmd.RegisterFlagCompletionFunc("kind", cobra.FixedCompletions([]string{"agent", "datapath", "ipam", "identity", "endpoints", "endpoint"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// actorTable prints the tree: each actor's name indented by its depth.
func (a *app) actorTable(list []*models.Actor) error {
	t := newTable(a.out, "ACTOR", "KIND", "STATE", "MAILBOX", "PROCESSED", "RESTARTS", "REV", "OPERATION", "BUSY", "LAST-ERROR")
	for _, ac := range list {
		depth := strings.Count(ac.Path, "/")
		name := ac.Path[strings.LastIndexByte(ac.Path, '/')+1:]
		rev, busy := "", ""
		if e := ac.Endpoint; e != nil {
			rev = fmt.Sprintf("%d/%d", e.RealizedRevision, e.DesiredRevision)
		}
		if ac.BusySeconds > 0 {
			busy = roundDuration(time.Duration(ac.BusySeconds * float64(time.Second))).String()
		}
		t.row(strings.Repeat("  ", depth)+name, ac.Kind, ac.State, ac.MailboxDepth, ac.Processed, ac.Restarts, rev,
			ac.Operation, busy, oneLine(ac.LastError))
	}
	return t.flush()
}

func roundDuration(d time.Duration) time.Duration {
	switch {
	case d > time.Minute:
		return d.Round(time.Second)
	case d > time.Second:
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 60 {
		return s[:57] + "..."
	}
	return s
}

func (a *app) actorCommand() *cobra.Command {
	cmd := group(&cobra.Command{Use: "actor", Short: "One actor"}, nil)
	cmd.AddCommand(&cobra.Command{
		Use: "get PATH", Short: "Show one actor's snapshot (PATH: agent/endpoints/ep-3, ep-3 or endpoint/3)", Args: exactArgs(1, "PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			ac, err := a.c.Actor(ctx, args[0])
			return a.printOr(ac, err)
		},
	})
	return cmd
}

func (a *app) monitorCommand() *cobra.Command {
	var types string
	var since uint64
	var count int
	cmd := &cobra.Command{
		Use: "monitor", Short: "Follow the agent's event stream (Ctrl-C ends it)", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := url.Values{}
			if types != "" {
				q.Set("type", types)
			}
			if since > 0 {
				q.Set("since", strconv.FormatUint(since, 10))
			}
			ctx, cancel := context.WithCancel(cmd.Context())
			if cmd.Flags().Changed("timeout") {
				ctx, cancel = a.ctx(cmd)
			}
			defer cancel()
			seen := 0
			var perr error
			err := a.c.Events(ctx, q, func(ev events.Event) bool {
				if perr = a.printEvent(ev); perr != nil {
					return false
				}
				seen++
				return count == 0 || seen < count
			})
			if perr != nil {
				return perr
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&types, "type", "", "comma-separated event types: "+typeNames())
	f.Uint64Var(&since, "since", 0, "replay the events after this event ID (as far as the agent still holds them)")
	f.IntVar(&count, "count", 0, "stop after this many events (0: follow until interrupted)")
	return cmd
}

func typeNames() string {
	s := make([]string, len(events.Types))
	for i, t := range events.Types {
		s[i] = string(t)
	}
	return strings.Join(s, ", ")
}

// printEvent writes one event: a line in table mode, a JSON line, or a
// YAML document.
func (a *app) printEvent(ev events.Event) error {
	switch a.output {
	case "json":
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.out, "%s\n", b)
		return err
	case "yaml":
		if _, err := fmt.Fprintln(a.out, "---"); err != nil {
			return err
		}
		return a.print(ev)
	}
	_, err := fmt.Fprintf(a.out, "%s  #%d  %s\n", ev.Time.UTC().Format("2006-01-02T15:04:05.000Z"), ev.Seq, eventText(ev))
	return err
}

func eventText(ev events.Event) string {
	if ev.Type == events.Missed {
		return fmt.Sprintf("missed %d events (the agent's buffer overflowed)", ev.Missed)
	}
	parts := []string{string(ev.Type)}
	if ev.Endpoint != 0 {
		parts = append(parts, fmt.Sprintf("endpoint=%d", ev.Endpoint))
	}
	if ev.Pod != "" {
		parts = append(parts, "pod="+ev.Namespace+"/"+ev.Pod)
	}
	switch {
	case ev.PrevState != "" && ev.State != "":
		parts = append(parts, "state="+ev.PrevState+"->"+ev.State)
	case ev.State != "":
		parts = append(parts, "state="+ev.State)
	}
	if ev.Identity != 0 {
		parts = append(parts, fmt.Sprintf("identity=%d", ev.Identity))
	}
	if len(ev.Labels) > 0 {
		parts = append(parts, "labels="+strings.Join(ev.Labels, ","))
	}
	if ev.Revision != 0 {
		parts = append(parts, fmt.Sprintf("revision=%d", ev.Revision))
	}
	if d := ev.Drop; d != nil {
		parts = append(parts, dropText(d))
	}
	if d := ev.DNS; d != nil {
		parts = append(parts, dnsText(d))
	}
	if l := ev.L7; l != nil {
		parts = append(parts, l7Text(l))
	}
	if ev.Message != "" {
		parts = append(parts, fmt.Sprintf("%q", ev.Message))
	}
	return strings.Join(parts, " ")
}

// dropText renders a dropped packet: reason, direction, the flow and the
// peer identity.
func dropText(d *events.Drop) string {
	s := fmt.Sprintf("reason=%s direction=%s", d.Reason, d.Direction)
	if d.Src != "" {
		s += fmt.Sprintf(" %s -> %s", hostPort(d.Src, d.SrcPort), hostPort(d.Dst, d.DstPort))
	}
	if d.Proto != 0 {
		s += fmt.Sprintf(" proto=%d", d.Proto)
	}
	if d.PeerIdentity != 0 {
		s += fmt.Sprintf(" peer-identity=%d", d.PeerIdentity)
	}
	return s
}

// l7Text renders an L7 access: verdict, direction, the flow with both
// identities and the request.
func l7Text(l *events.L7) string {
	s := fmt.Sprintf("%s verdict=%s direction=%s %s (identity %d) -> %s (identity %d)",
		l.Protocol, l.Verdict, l.Direction, l.Src, l.SrcIdentity, l.Dst, l.DstIdentity)
	if l.Method != "" {
		s += fmt.Sprintf(" %s %s", l.Method, l.Path)
	}
	if l.HTTPVersion != "" {
		s += " " + l.HTTPVersion
	}
	if l.GRPC {
		s += " grpc"
	}
	if l.Code != 0 {
		s += fmt.Sprintf(" code=%d", l.Code)
	}
	if l.GRPCStatus != 0 {
		s += fmt.Sprintf(" grpc-status=%d", l.GRPCStatus)
	}
	for _, m := range l.HeaderMismatches {
		s += " header-mismatch=" + strings.ReplaceAll(m, " ", ":")
	}
	if l.Host != "" {
		s += " host=" + l.Host
	}
	if l.Reason != "" {
		s += fmt.Sprintf(" reason=%q", l.Reason)
	}
	return s
}

// hostPort joins an address and a port (the address alone for port 0).
func hostPort(addr string, port uint16) string {
	if port == 0 {
		return addr
	}
	return net.JoinHostPort(addr, strconv.Itoa(int(port)))
}
