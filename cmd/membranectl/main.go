// Command membranectl queries and drives a running membrane-agent over its
// unix socket: status, endpoints, IPAM and identities. Output is JSON
// (-o json) or a table for lists (-o table, the default).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/membrane-cni/membrane/pkg/client"
	"github.com/membrane-cni/membrane/pkg/models"
)

const usage = `usage: membranectl [--socket PATH] [-o table|json] COMMAND

commands:
  status                                  agent status
  endpoint list [--namespace NS] [--pod P] [--state S] [--identity N] [--label L]...
  endpoint get REF                        REF: ID, container-id:ID or pod-name:NS/POD
  endpoint create REF [--container-id C] [--namespace NS] [--pod P] [--label L]... [--ipv4 IP] [--ipv6 IP] [--sync]
  endpoint delete REF
  endpoint labels REF [--add L]... [--delete L]...
  endpoint regenerate REF
  endpoint health REF
  ipam [status]                           pools and allocations
  ipam allocate [--family ipv4|ipv6] [--owner NS/POD]
  ipam release IP
  identity list
  identity get ID
`

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("membranectl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	socket := fs.String("socket", "/var/run/membrane/membrane.sock", "agent socket")
	out := fs.String("o", "table", "output: table or json")
	timeout := fs.Duration("timeout", 60*time.Second, "request timeout")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *out != "table" && *out != "json" {
		fmt.Fprintf(stderr, "membranectl: -o: %q: want table or json\n", *out)
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	c := &cli{c: client.New(*socket), out: stdout, json: *out == "json"}
	err := c.dispatch(ctx, fs.Args())
	var ue usageError
	switch {
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "membranectl: %v\n%s", err, usage)
		return 2
	case err != nil:
		fmt.Fprintf(stderr, "membranectl: %v\n", err)
		return 1
	}
	return 0
}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

type cli struct {
	c    *client.Client
	out  io.Writer
	json bool
}

func (c *cli) dispatch(ctx context.Context, args []string) error {
	cmd, rest := args[0], args[1:]
	sub := ""
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		sub, rest = rest[0], rest[1:]
	}
	switch cmd {
	case "status":
		st, err := c.c.Status(ctx)
		if st != nil && st.State != "" {
			return errors.Join(c.print(st), err)
		}
		return err
	case "endpoint", "endpoints", "ep":
		return c.endpoint(ctx, sub, rest)
	case "ipam":
		return c.ipam(ctx, sub, rest)
	case "identity", "identities":
		return c.identity(ctx, sub, rest)
	}
	return usageError{fmt.Sprintf("unknown command %q", cmd)}
}

// multi is a repeatable string flag.
type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

// refArg splits "REF [flags]" and parses the flags.
func refArg(fs *flag.FlagSet, args []string) (string, error) {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return "", usageError{fs.Name() + ": missing REF"}
	}
	if err := fs.Parse(args[1:]); err != nil {
		return "", usageError{err.Error()}
	}
	return args[0], nil
}

func (c *cli) endpoint(ctx context.Context, sub string, args []string) error {
	fs := flag.NewFlagSet("endpoint "+sub, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	switch sub {
	case "list", "":
		ns, pod, state, ident := fs.String("namespace", "", ""), fs.String("pod", "", ""), fs.String("state", "", ""), fs.String("identity", "", "")
		var ls multi
		fs.Var(&ls, "label", "")
		if err := fs.Parse(args); err != nil {
			return usageError{err.Error()}
		}
		q := url.Values{}
		for k, v := range map[string]string{"namespace": *ns, "pod": *pod, "state": *state, "identity": *ident} {
			if v != "" {
				q.Set(k, v)
			}
		}
		for _, l := range ls {
			q.Add("label", l)
		}
		eps, err := c.c.EndpointList(ctx, q)
		if err != nil {
			return err
		}
		return c.endpointTable(eps)
	case "get":
		ref, err := refArg(fs, args)
		if err != nil {
			return err
		}
		ep, err := c.c.EndpointGet(ctx, ref)
		return c.printOr(ep, err)
	case "create":
		return c.endpointCreate(ctx, fs, args)
	case "delete":
		ref, err := refArg(fs, args)
		if err != nil {
			return err
		}
		return c.c.EndpointDelete(ctx, ref)
	case "labels":
		var add, del multi
		fs.Var(&add, "add", "")
		fs.Var(&del, "delete", "")
		ref, err := refArg(fs, args)
		if err != nil {
			return err
		}
		ep, err := c.c.EndpointPatchLabels(ctx, ref, add, del)
		return c.printOr(ep, err)
	case "regenerate":
		ref, err := refArg(fs, args)
		if err != nil {
			return err
		}
		ep, err := c.c.EndpointRegenerate(ctx, ref)
		return c.printOr(ep, err)
	case "health":
		ref, err := refArg(fs, args)
		if err != nil {
			return err
		}
		h, err := c.c.EndpointHealth(ctx, ref)
		if h != nil && h.State != "" {
			return errors.Join(c.print(h), err)
		}
		return err
	}
	return usageError{fmt.Sprintf("unknown endpoint command %q", sub)}
}

func (c *cli) endpointCreate(ctx context.Context, fs *flag.FlagSet, args []string) error {
	req := &models.EndpointChangeRequest{}
	var ls multi
	fs.StringVar(&req.ContainerID, "container-id", "", "")
	fs.StringVar(&req.K8sNamespace, "namespace", "", "")
	fs.StringVar(&req.K8sPodName, "pod", "", "")
	fs.Var(&ls, "label", "")
	v4, v6 := fs.String("ipv4", "", ""), fs.String("ipv6", "", "")
	fs.BoolVar(&req.SyncBuild, "sync", false, "")
	ref, err := refArg(fs, args)
	if err != nil {
		return err
	}
	req.Labels = ls
	if *v4 != "" || *v6 != "" {
		req.Addressing = &models.AddressPair{IPv4: *v4, IPv6: *v6}
	}
	ep, err := c.c.EndpointCreate(ctx, ref, req)
	return c.printOr(ep, err)
}

func (c *cli) endpointTable(eps []*models.Endpoint) error {
	if c.json {
		return c.print(eps)
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tIDENTITY\tIPV4\tIPV6\tPOD\tCONTAINER\tLABELS")
	for _, ep := range eps {
		ident, v4, v6 := "-", "-", "-"
		if ep.Identity != nil {
			ident = strconv.FormatInt(ep.Identity.ID, 10)
		}
		if a := ep.Addressing; a != nil {
			v4, v6 = orDash(a.IPv4), orDash(a.IPv6)
		}
		pod := "-"
		if ep.K8sPodName != "" {
			pod = ep.K8sNamespace + "/" + ep.K8sPodName
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ep.ID, ep.State, ident, v4, v6, pod,
			orDash(shortID(ep.ContainerID)), strings.Join(ep.Labels, ","))
	}
	return tw.Flush()
}

func (c *cli) ipam(ctx context.Context, sub string, args []string) error {
	fs := flag.NewFlagSet("ipam "+sub, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	switch sub {
	case "", "status":
		st, err := c.c.IPAMStatus(ctx)
		return c.printOr(st, err)
	case "allocate":
		fam, owner := fs.String("family", "", ""), fs.String("owner", "", "")
		if err := fs.Parse(args); err != nil {
			return usageError{err.Error()}
		}
		r, err := c.c.IPAMAllocate(ctx, *fam, *owner)
		return c.printOr(r, err)
	case "release":
		ip, err := refArg(fs, args)
		if err != nil {
			return err
		}
		return c.c.IPAMRelease(ctx, ip)
	}
	return usageError{fmt.Sprintf("unknown ipam command %q", sub)}
}

func (c *cli) identity(ctx context.Context, sub string, args []string) error {
	switch sub {
	case "", "list":
		ids, err := c.c.Identities(ctx)
		if err != nil || c.json {
			return c.printOr(ids, err)
		}
		tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tREFS\tLABELS")
		for _, id := range ids {
			fmt.Fprintf(tw, "%d\t%d\t%s\n", id.ID, id.RefCount, strings.Join(id.Labels, ","))
		}
		return tw.Flush()
	case "get":
		if len(args) != 1 {
			return usageError{"identity get: want one ID"}
		}
		n, err := strconv.ParseInt(args[0], 10, 64)
		if err != nil {
			return usageError{fmt.Sprintf("identity get: %q is not a number", args[0])}
		}
		id, err := c.c.Identity(ctx, n)
		return c.printOr(id, err)
	}
	return usageError{fmt.Sprintf("unknown identity command %q", sub)}
}

func (c *cli) printOr(v any, err error) error {
	if err != nil {
		return err
	}
	return c.print(v)
}

func (c *cli) print(v any) error {
	enc := json.NewEncoder(c.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func shortID(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}
