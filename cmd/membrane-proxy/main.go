// Command membrane-proxy is the L7 (HTTP and Kafka) proxy of the Membrane agent:
// a process of its own, configured by the agent over xDS on a unix
// socket and supervised (restarted) by it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/membrane-cni/membrane/datapath/l7proxy/proxy"
)

// defaultGCPercent is --gc-percent's default. The proxy's live heap is a
// few MiB (its configuration) while every request allocates short-lived
// garbage: at Go's 100% it collected every few hundred requests, and the
// collector's workers woke the second core each time.
const defaultGCPercent = 400

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "membrane-proxy:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("membrane-proxy", flag.ContinueOnError)
	xds := fs.String("xds", "/var/run/membrane/xds.sock", "the agent's xDS unix socket")
	listen := fs.String("listen", "127.0.0.1:15001", "HTTP listening address")
	kafka := fs.String("kafka-listen", "", "Kafka listening address (none if empty)")
	access := fs.String("access-log", "", "the agent's unixgram socket for access records (none if empty)")
	ackDelay := fs.Duration("ack-delay", 0, "delay every acknowledgement (fault injection, testing)")
	ackDrop := fs.Float64("ack-drop-rate", 0, "lose acknowledgements with this probability (fault injection, testing)")
	parentPID := fs.Int("parent-pid", 0, "exit when this process (the agent) is no longer the parent (0: the parent at start)")
	reject := fs.Bool("reject-config", false, "reject every configuration (testing)")
	gcPercent := fs.Int("gc-percent", defaultGCPercent, "garbage collection target percentage (GOGC, which wins when set; 0: Go's default)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *gcPercent < 0 {
		return fmt.Errorf("--gc-percent %d: want 0 or more", *gcPercent)
	}
	if *gcPercent != 0 && os.Getenv("GOGC") == "" {
		debug.SetGCPercent(*gcPercent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, orphaned := context.WithCancel(ctx)
	defer orphaned()
	go exitWithParent(ctx, orphaned, *parentPID)
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "membrane-proxy")
	return proxy.Run(ctx, proxy.Config{XDS: *xds, Listen: *listen, KafkaListen: *kafka, AccessLog: *access, Log: log, Reject: *reject,
		AckDelay: *ackDelay, AckDropRate: *ackDrop})
}

// exitWithParent ends the proxy when the agent that started it is gone
// (the process is re-parented): a killed agent's proxy would otherwise
// keep the listening port, and the next agent's proxy could not bind it.
func exitWithParent(ctx context.Context, orphaned context.CancelFunc, parent int) {
	if parent == 0 {
		parent = os.Getppid()
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if os.Getppid() != parent {
				// Also when the agent died before the proxy started.
				fmt.Fprintln(os.Stderr, "membrane-proxy: the agent that started it is gone; exiting")
				orphaned()
				return
			}
		}
	}
}
