package cnibench

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// agentProc is a membrane-agent process in an arm's host netns: the
// agent runs as on a node, in a process of its own, not in the bench's
// (where libcni's blocking wait for each plugin would hold one of the
// machine's two Go processors the agent needs; a container runtime is a
// process of its own too).
type agentProc struct {
	cmd    *exec.Cmd
	socket string
	http   *http.Client
	done   <-chan struct{}
}

// buildAgent builds membrane-agent into dir/bin, as make build does.
func buildAgent(t *testing.T, dir string) string {
	t.Helper()
	if err := testutil.BuildBinaries(filepath.Join(dir, "bin"), "membrane-agent"); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "bin", "membrane-agent")
}

// startAgent starts bin with args in host and waits until it is ready;
// the test's cleanup stops it (SIGTERM, then SIGKILL), and it dies with
// the thread that started it (Pdeathsig) if the bench dies first. Its
// log goes to dir/agent.log, printed if the test failed.
func startAgent(t *testing.T, host *testutil.NS, bin, dir string, args ...string) *agentProc {
	t.Helper()
	logPath := filepath.Join(dir, "agent.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	p := &agentProc{socket: filepath.Join(dir, "agent.sock")}
	p.cmd = exec.Command(bin, append([]string{"--socket", p.socket}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// It dies with the thread that started it (Pdeathsig), which entered
	// the host netns for it.
	done, err := host.StartPinned(p.cmd)
	if err != nil {
		t.Fatalf("start membrane-agent: %v", err)
	}
	p.done = done
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("%s:\n%s", logPath, b)
		}
	})
	p.http = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", p.socket)
		}}}
	p.waitReady(t)
	return p
}

func (p *agentProc) waitReady(t *testing.T) {
	t.Helper()
	c := client.New(p.socket)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx, p.done); err != nil {
		t.Fatalf("membrane-agent: %v", err)
	}
}

func (p *agentProc) stop() { testutil.Stop(p.cmd.Process, p.done, 60*time.Second) }

// metrics reads the agent's GET /metrics.
func (p *agentProc) metrics() (map[string]*dto.MetricFamily, error) {
	res, err := p.http.Get("http://agent/metrics")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		return nil, fmt.Errorf("GET /metrics: %s: %s", res.Status, b)
	}
	var parser expfmt.TextParser
	return parser.TextToMetricFamilies(res.Body)
}

// cpu is the agent's user+system CPU time so far (/proc/<pid>/stat).
func (p *agentProc) cpu() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// The fields after the command name (which may hold spaces, in
	// parentheses): state is field 3, utime 14 and stime 15.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times (100 on
// every Linux architecture Go supports).
const clockTicks = 100
