package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/domain/ifname"
)

// runCleanup undoes what install-cni and the agent made on the node, in
// the order that keeps the node usable: the conflist first (the runtime
// stops sending pods to membrane-cni), then the plugin, the datapath
// (devices, filters, routes, rules, the masquerade table, every BPF pin)
// and the agent's state, sockets and delete queue. Run it with the agent
// stopped, after its pods are gone (their host veths go): Cilium's
// cleanup mode. Idempotent.
func runCleanup(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("membrane-agent cleanup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	binDir := fs.String("cni-bin-dir", "/host/opt/cni/bin", "the host's CNI plugin directory, as mounted (membrane-cni is removed from it)")
	confDir := fs.String("cni-conf-dir", "/host/etc/cni/net.d", "the host's CNI configuration directory, as mounted (the conflist is removed from it)")
	conflist := fs.String("conflist-name", "05-membrane.conflist", "the conflist's file name")
	var cfg datapath.CleanupConfig
	fs.StringVar(&cfg.BPFFS, "bpffs", datapath.DefaultBPFFS, "the agent's bpffs directory (--bpffs)")
	fs.StringVar(&cfg.GatewayDevice, "gateway-device", datapath.DefaultGatewayDevice, "the agent's gateway device (--gateway-device)")
	fs.StringVar(&cfg.TunnelDevice, "tunnel-device", datapath.DefaultTunnelDevice, "the agent's tunnel device")
	stateDir := fs.String("state-dir", "/var/run/membrane/state", "the agent's state directory (--state-dir)")
	socket := fs.String("socket", "/var/run/membrane/membrane.sock", "the agent's socket (--socket)")
	queue := fs.String("delete-queue-dir", "/var/run/membrane/delete-queue", "the agent's delete queue (--delete-queue-dir)")
	xds := fs.String("l7-xds-socket", datapath.DefaultXDSSocket, "the agent's L7 proxy xDS socket (--l7-xds-socket); the proxy's access socket next to it goes too")
	wait := fs.Bool("wait", false, "once clean, wait for SIGTERM (the uninstall DaemonSet: a running pod means its node is clean)")
	if err := fs.Parse(args); err != nil {
		return exitParse(err)
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "membrane-agent cleanup: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	for _, p := range []*string{binDir, confDir, stateDir, socket, queue, xds, &cfg.BPFFS} {
		if !filepath.IsAbs(*p) || filepath.Clean(*p) == "/" {
			fmt.Fprintf(stderr, "membrane-agent cleanup: %q: want an absolute path below /\n", *p)
			return 2
		}
	}
	if *conflist != filepath.Base(*conflist) || *conflist == "." || *conflist == ".." {
		fmt.Fprintf(stderr, "membrane-agent cleanup: --conflist-name %q: want a file name\n", *conflist)
		return 2
	}
	// --wait: SIGTERM is taken from the start, so a signal that comes as
	// soon as the node is clean ends the wait instead of the process.
	waitCtx, stop := context.Background(), func() {}
	if *wait {
		waitCtx, stop = signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	}
	defer stop()
	log := slog.New(slog.NewTextHandler(stderr, nil))
	var errs []error
	for _, f := range []string{filepath.Join(*confDir, *conflist), filepath.Join(*binDir, "membrane-cni")} {
		if err := os.Remove(f); err == nil {
			log.Info("removed", "file", f)
		} else if !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	cfg.HealthNetns = filepath.Join(*stateDir, "health", "netns")
	cfg.HealthIfName = ifname.Health
	rep, err := datapath.Cleanup(context.Background(), cfg, log)
	errs = append(errs, err)
	// The L7 proxy's sockets: the agent leaves the access socket (a
	// unixgram socket is not unlinked on close), and a killed agent both.
	for _, p := range []string{*stateDir, *queue, *socket, *xds, datapath.L7AccessSocket(*xds)} {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintf(stderr, "membrane-agent cleanup: %v\n", err)
		return 1
	}
	log.Info("node cleaned up", "removed", rep.String())
	if *wait {
		<-waitCtx.Done()
	}
	return 0
}
