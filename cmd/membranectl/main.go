// Command membranectl is the operator's client of membrane-agent. It talks
// to the agent's unix socket (--socket) or, for reads, to its HTTP
// listener (--server http://127.0.0.1:9890): status, endpoints,
// identities, IPAM, policy, ipcache, the actor tree and the event stream.
// Output is an aligned table (the default), JSON or YAML (-o).
//
// Exit codes: 0 success, 1 an error answered by the agent or a local
// failure, 2 bad usage, 3 not found, 4 agent unreachable, 5 agent not
// ready (starting or stopping).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/membrane-cni/membrane/pkg/clients/client"
)

// Exit codes.
const (
	exitOK          = 0
	exitError       = 1
	exitUsage       = 2
	exitNotFound    = 3
	exitUnreachable = 4
	exitNotReady    = 5
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// app is the state shared by the commands.
type app struct {
	socket, server, output string
	timeout                time.Duration
	out, errOut            io.Writer
	c                      *client.Client
}

// usageError marks errors of the command line (exit 2).
type usageError struct{ error }

// exitError carries an explicit exit code (status of a not-ready agent).
type exitCodeError struct {
	error
	code int
}

func run(args []string, stdout, stderr io.Writer) int {
	a := &app{out: stdout, errOut: stderr}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	if strings.HasPrefix(err.Error(), "unknown command") {
		err = usageError{err}
	}
	fmt.Fprintf(stderr, "membranectl: %v\n", err)
	return exitCode(err)
}

// exitCode maps an error to the documented exit codes.
func exitCode(err error) int {
	var ue usageError
	var ec exitCodeError
	var ae *client.APIError
	var oe *net.OpError
	switch {
	case errors.As(err, &ue):
		return exitUsage
	case errors.As(err, &ec):
		return ec.code
	case errors.As(err, &ae) && ae.Status == http.StatusNotFound:
		return exitNotFound
	case errors.As(err, &ae) && ae.Status == http.StatusServiceUnavailable:
		return exitNotReady
	case errors.As(err, &ae):
		return exitError
	case errors.As(err, &oe): // dialing the socket or the server failed
		return exitUnreachable
	}
	return exitError
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "membranectl",
		Short: "Operate a membrane-agent: endpoints, identities, IPAM, policy, actors, events",
		Long: "membranectl talks to membrane-agent over its unix socket (--socket) or, read-only, its\n" +
			"HTTP listener (--server). Exit codes: 0 ok, 1 error, 2 usage, 3 not found,\n" +
			"4 agent unreachable, 5 agent not ready.",
		SilenceUsage:      true,
		SilenceErrors:     true,
		PersistentPreRunE: a.setup,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	f := root.PersistentFlags()
	f.StringVar(&a.socket, "socket", "/var/run/membrane/membrane.sock", "agent unix socket")
	f.StringVar(&a.server, "server", "", "agent HTTP URL instead of the socket, e.g. http://127.0.0.1:9890 (read-only)")
	f.StringVarP(&a.output, "output", "o", "table", "output format: table, json or yaml")
	f.DurationVar(&a.timeout, "timeout", 60*time.Second, "request timeout (monitor: none unless set)")
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
	root.AddCommand(a.statusCommand(), a.healthCommand(), a.endpointCommand(), a.identityCommand(), a.ipamCommand(),
		a.policyCommand(), a.ipcacheCommand(), a.nodeCommand(), a.serviceCommand(), a.dropsCommand(), a.actorsCommand(), a.actorCommand(), a.monitorCommand(),
		a.fqdnCommand(), a.connectivityCommand(), a.observeCommand())
	return root
}

// setup validates the global flags and builds the client.
func (a *app) setup(cmd *cobra.Command, _ []string) error {
	switch a.output {
	case "table", "json", "yaml":
	default:
		return usageError{fmt.Errorf("-o: %q: want table, json or yaml", a.output)}
	}
	if a.server != "" {
		c, err := client.NewURL(a.server)
		if err != nil {
			return usageError{fmt.Errorf("--server: %w", err)}
		}
		a.c = c
	} else {
		a.c = client.New(a.socket)
	}
	return nil
}

// ctx bounds one command by --timeout.
func (a *app) ctx(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), a.timeout)
}

// args checks positional arguments as usage errors.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return usageError{fmt.Errorf("want %s, got %d argument(s)", what, len(args))}
		}
		return nil
	}
}

func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", args[0])}
	}
	return nil
}

// group makes cmd a command group: an unknown subcommand is a usage error
// (cobra would print help and succeed); without arguments it runs def, or
// prints help and fails with a usage error when def is nil.
func group(cmd *cobra.Command, def func(*cobra.Command, []string) error) *cobra.Command {
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if len(args) > 0 {
			return usageError{fmt.Errorf("unknown command %q for %q", args[0], c.CommandPath())}
		}
		if def != nil {
			return def(c, args)
		}
		_ = c.Help()
		return usageError{fmt.Errorf("%s: missing subcommand", c.CommandPath())}
	}
	return cmd
}
