package crash

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/client"
)

// restoredLine is the agent's log line after restore, with its duration.
var restoredLine = regexp.MustCompile(`msg="restored endpoints" found=(\d+) restored=(\d+).* duration=(\S+)`)

// TestRestoreTime measures how long an agent (linux datapath) restarted
// with RESTORE_N endpoints (default 100, made by the CNI plugin) takes
// until it serves (restore done) and until every endpoint is ready again.
// Set MEMBRANE_BENCH_RESTORE=1 (make bench-restore; RESTORE_HEALTH=0
// without the health endpoint, RESTORE_LOG=1 prints the agent's start-up
// log lines); numbers go to BENCHMARKS.md, nothing is asserted on time.
func TestRestoreTime(t *testing.T) {
	if os.Getenv("MEMBRANE_BENCH_RESTORE") == "" {
		t.Skip("set MEMBRANE_BENCH_RESTORE=1 (make bench-restore) to measure restore time")
	}
	n, _ := strconv.Atoi(os.Getenv("RESTORE_N"))
	if n <= 0 {
		n = 100
	}
	flags := []string{"--gc-interval", "1m"}
	want := n + 1 // the pods and the health endpoint
	if os.Getenv("RESTORE_HEALTH") == "0" {
		flags, want = append(flags, "--enable-health=false"), n
	}
	ap := linuxAgent(t, "10.254.0.0/22", flags...)
	ap.Start()
	d := newCNIDriver(t, ap)
	w := newWorld(1)
	for range n {
		p := w.newPod()
		if err := d.add(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	for _, kill := range []bool{false, true} {
		serving, allReady := measureRestart(t, ap, kill, want)
		data, _ := os.ReadFile(ap.Log)
		if os.Getenv("RESTORE_LOG") != "" {
			for _, line := range regexp.MustCompile(`(?m)^.*(linux datapath ready|restored endpoints|health endpoint ready|agent ready|previous health).*$`).FindAll(data, -1) {
				fmt.Println(string(line))
			}
		}
		ms := restoredLine.FindAllSubmatch(data, -1)
		inAgent := "?"
		if len(ms) > 0 {
			inAgent = string(ms[len(ms)-1][3])
			if d, err := time.ParseDuration(inAgent); err == nil { // as logged: 8.703492ms
				inAgent = d.Round(100 * time.Microsecond).String()
			}
		}
		fmt.Printf("restart after %s with %d endpoints: restore in the agent %s, process start to serving %v, to all ready %v\n",
			map[bool]string{false: "SIGTERM", true: "SIGKILL"}[kill], want, inAgent, serving.Round(time.Millisecond), allReady.Round(time.Millisecond))
	}
}

// measureRestart stops (SIGTERM) or kills the agent, starts it again and
// returns how long until it served and until want endpoints were ready.
func measureRestart(t *testing.T, ap *agentProc, kill bool, want int) (serving, allReady time.Duration) {
	t.Helper()
	if kill {
		ap.Kill()
	} else {
		ap.Stop()
	}
	t0 := time.Now()
	ap.Start() // returns once GET /v1/status says ok
	serving = time.Since(t0)
	c := client.New(ap.Socket)
	defer c.Close()
	for {
		eps, err := c.EndpointList(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		ready := 0
		for _, ep := range eps {
			if ep.State == "ready" {
				ready++
			}
		}
		if ready >= want {
			return serving, time.Since(t0)
		}
		if time.Since(t0) > time.Minute {
			t.Fatalf("%d of %d endpoints ready after a minute", ready, want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
