// Command probe is the e2e suite's agnhost: the container of every test
// pod. It answers on TCP and UDP ports 80 and 81 (and any in $PORTS) with
// its pod's namespace/name, so the test (which dials from inside another
// pod's network namespace) knows who answered. Two TCP requests act from
// inside the pod, with its own resolver (kubelet's /etc/resolv.conf: the
// cluster DNS, the search path): "resolve NAME" answers the addresses of
// NAME, "connect HOST:PORT" dials it, sends one line and answers with
// what came back. Static, no libc: it runs from a one-file image
// imported into containerd.
package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
)

func main() {
	id := os.Getenv("POD_NAMESPACE") + "/" + os.Getenv("POD_NAME")
	ports := []string{"80", "81"}
	if p := os.Getenv("PORTS"); p != "" {
		ports = strings.Split(p, ",")
	}
	for _, p := range ports {
		ln, err := net.Listen("tcp", ":"+p)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		go serveTCP(ln, id)
		pc, err := net.ListenPacket("udp", ":"+p)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		go serveUDP(pc, id)
	}
	fmt.Println("probe", id, "serving on", ports)
	// PID 1 of its container: without a handler SIGTERM would be ignored
	// and every pod deletion would wait for the grace period.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}

// serveTCP answers every line a client sends with the pod's id, until the
// client closes (long-lived flows for the agent restart test).
func serveTCP(ln net.Listener, id string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			r := bufio.NewReader(c)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if _, err := fmt.Fprintf(c, "%s %s\n", id, answer(strings.TrimSuffix(line, "\n"))); err != nil {
					return
				}
			}
		}()
	}
}

// serveUDP answers every datagram with the pod's id.
func serveUDP(pc net.PacketConn, id string) {
	buf := make([]byte, 1500)
	for {
		n, addr, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		_, _ = pc.WriteTo([]byte(id+" "+string(buf[:n])), addr)
	}
}

// answer is the reply to one request line: its own text, or for "resolve"
// and "connect" the result (errors as "error: ...").
func answer(line string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	switch verb, arg, _ := strings.Cut(line, " "); verb {
	case "resolve":
		addrs, err := net.DefaultResolver.LookupHost(ctx, arg)
		if err != nil {
			return "error: " + err.Error()
		}
		slices.Sort(addrs)
		return strings.Join(addrs, ",")
	case "connect":
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", arg)
		if err != nil {
			return "error: " + err.Error()
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := fmt.Fprintln(c, "probe"); err != nil {
			return "error: " + err.Error()
		}
		got, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return "error: " + err.Error()
		}
		return strings.TrimSuffix(got, "\n")
	}
	return line
}
