package main

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

const refHelp = "REF is an endpoint ID, container-id:<id>, cni-attachment-id:<id>:<ifname> or pod-name:<namespace>/<pod>"

func (a *app) endpointCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "endpoint", Aliases: []string{"endpoints", "ep"}, Short: "List, inspect and change endpoints"}
	list := a.endpointList()
	cmd.AddCommand(list, a.endpointGet(), a.endpointCreate(), a.endpointDelete(), a.endpointLabels(),
		a.endpointRegenerate(), a.endpointHealth(), a.endpointPolicy())
	return group(cmd, list.RunE)
}

func (a *app) endpointList() *cobra.Command {
	var ns, pod, state, ident, selector, ip string
	var ls []string
	var limit, after int
	cmd := &cobra.Command{
		Use: "list", Aliases: []string{"ls"}, Short: "List endpoints; filters combine", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := url.Values{}
			for k, v := range map[string]string{"namespace": ns, "pod": pod, "state": state, "identity": ident, "selector": selector, "ip": ip} {
				if v != "" {
					q.Set(k, v)
				}
			}
			for _, l := range ls {
				q.Add("label", l)
			}
			if limit > 0 {
				q.Set("limit", strconv.Itoa(limit))
			}
			if after > 0 {
				q.Set("after", strconv.Itoa(after))
			}
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			eps, next, total, err := a.c.EndpointPage(ctx, q)
			if err != nil {
				return err
			}
			if err := a.endpointTable(eps); err != nil {
				return err
			}
			if next > 0 {
				fmt.Fprintf(a.errOut, "%d of %d shown; next page: --after %d\n", len(eps), total, next)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&ns, "namespace", "", "pod namespace")
	f.StringVar(&pod, "pod", "", "pod name (with --namespace)")
	f.StringVar(&state, "state", "", "lifecycle state, e.g. ready, regenerating")
	f.StringVar(&ident, "identity", "", "numeric identity")
	f.StringVar(&selector, "selector", "", "label selector, e.g. app=web,tier!=db,!canary")
	f.StringVar(&ip, "ip", "", "an address of the endpoint")
	f.StringArrayVar(&ls, "label", nil, "label the endpoint has (repeatable), e.g. k8s:app=web")
	f.IntVar(&limit, "limit", 0, "page size (0: everything)")
	f.IntVar(&after, "after", 0, "list endpoints with IDs above this (next page)")
	_ = cmd.RegisterFlagCompletionFunc("state", cobra.FixedCompletions([]string{"waiting-for-identity", "waiting-to-regenerate",
		"regenerating", "ready", "disconnecting", "disconnected", "restoring"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func (a *app) endpointTable(eps []*models.Endpoint) error {
	if a.output != "table" {
		if eps == nil {
			eps = []*models.Endpoint{}
		}
		return a.print(eps)
	}
	t := newTable(a.out, "ENDPOINT", "STATE", "IDENTITY", "POLICY-REV", "IPV4", "IPV6", "POD", "CONTAINER", "LABELS")
	for _, ep := range eps {
		ident, v4, v6 := "", "", ""
		if ep.Identity != nil {
			ident = strconv.FormatInt(ep.Identity.ID, 10)
		}
		if ad := ep.Addressing; ad != nil {
			v4, v6 = ad.IPv4, ad.IPv6
		}
		pod := ""
		if ep.K8sPodName != "" {
			pod = ep.K8sNamespace + "/" + ep.K8sPodName
		}
		t.row(ep.ID, ep.State, ident, ep.PolicyRevision, v4, v6, pod, shortID(ep.ContainerID), strings.Join(ep.Labels, ","))
	}
	return t.flush()
}

func (a *app) endpointGet() *cobra.Command {
	return &cobra.Command{
		Use: "get REF", Short: "Show one endpoint (" + refHelp + ")", Args: exactArgs(1, "REF"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			ep, err := a.c.EndpointGet(ctx, args[0])
			return a.printOr(ep, err)
		},
	}
}

func (a *app) endpointCreate() *cobra.Command {
	req := &models.EndpointChangeRequest{}
	var v4, v6 string
	cmd := &cobra.Command{
		Use: "create REF", Short: "Create an endpoint (REF 0 lets the agent pick the ID)", Args: exactArgs(1, "REF"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if v4 != "" || v6 != "" {
				req.Addressing = &models.AddressPair{IPv4: v4, IPv6: v6}
			}
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			ep, err := a.c.EndpointCreate(ctx, args[0], req)
			return a.printOr(ep, err)
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.ContainerID, "container-id", "", "container (sandbox) ID")
	f.StringVar(&req.K8sNamespace, "namespace", "", "pod namespace")
	f.StringVar(&req.K8sPodName, "pod", "", "pod name")
	f.StringArrayVar(&req.Labels, "label", nil, "label (repeatable), e.g. k8s:app=web")
	f.StringVar(&v4, "ipv4", "", "IPv4 address (allocated with ipam allocate)")
	f.StringVar(&v6, "ipv6", "", "IPv6 address")
	f.BoolVar(&req.SyncBuild, "sync", false, "answer after the first regeneration")
	return cmd
}

func (a *app) endpointDelete() *cobra.Command {
	return &cobra.Command{
		Use: "delete REF", Short: "Delete an endpoint", Args: exactArgs(1, "REF"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			if err := a.c.EndpointDelete(ctx, args[0]); err != nil {
				return err
			}
			if a.output == "table" {
				fmt.Fprintf(a.out, "endpoint %s deleted\n", args[0])
			}
			return nil
		},
	}
}

func (a *app) endpointLabels() *cobra.Command {
	var add, del []string
	cmd := &cobra.Command{
		Use: "labels REF", Short: "Add and delete labels (new identity, regeneration)", Args: exactArgs(1, "REF"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			if len(add) == 0 && len(del) == 0 {
				ep, err := a.c.EndpointGet(ctx, args[0])
				if err != nil {
					return err
				}
				return a.print(map[string]any{"labels": ep.Labels})
			}
			ep, err := a.c.EndpointPatchLabels(ctx, args[0], add, del)
			return a.printOr(ep, err)
		},
	}
	cmd.Flags().StringArrayVar(&add, "add", nil, "label to add (repeatable)")
	cmd.Flags().StringArrayVar(&del, "delete", nil, "label to delete (repeatable)")
	return cmd
}

func (a *app) endpointRegenerate() *cobra.Command {
	return &cobra.Command{
		Use: "regenerate REF", Short: "Regenerate an endpoint and wait for it", Args: exactArgs(1, "REF"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			ep, err := a.c.EndpointRegenerate(ctx, args[0])
			return a.printOr(ep, err)
		},
	}
}

func (a *app) endpointHealth() *cobra.Command {
	return &cobra.Command{
		Use: "health REF", Short: "Check an endpoint's state and datapath", Args: exactArgs(1, "REF"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			h, err := a.c.EndpointHealth(ctx, args[0])
			if h != nil && h.State != "" {
				// An unhealthy endpoint is answered with 503 and its body.
				if perr := a.print(h); perr != nil {
					return perr
				}
				if err != nil {
					return exitCodeError{errors.New("endpoint is not healthy"), exitError}
				}
				return nil
			}
			return err
		},
	}
}

func (a *app) endpointPolicy() *cobra.Command {
	return &cobra.Command{
		Use: "policy REF", Short: "Show the policy computed for an endpoint", Args: exactArgs(1, "REF"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			pol, err := a.c.EndpointPolicy(ctx, args[0])
			if err != nil {
				return err
			}
			return a.print(pol)
		},
	}
}
