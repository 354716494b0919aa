package crash

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// agentProc is a membrane-agent process that the test starts, kills and
// restarts on the same socket, state directory and delete queue.
type agentProc struct {
	t      *testing.T
	dir    string
	socket string
	state  string
	queue  string
	bpffs  string
	args   []string     // extra flags
	wrap   []string     // a command the agent runs under (its path and flags follow), or none
	ns     *testutil.NS // where the process runs; nil: the test's own netns
	log    string       // the agent's stderr, appended across restarts
	cmd    *exec.Cmd
	exited chan struct{}
	starts int
}

func newAgentProc(t *testing.T, cidr string, extra ...string) *agentProc {
	t.Helper()
	dir := t.TempDir()
	p := &agentProc{t: t, dir: dir, socket: filepath.Join(dir, "agent.sock"), state: filepath.Join(dir, "state"),
		queue: filepath.Join(dir, "delete-queue"), bpffs: filepath.Join(dir, "bpffs"), log: filepath.Join(dir, "agent.log")}
	p.args = append([]string{"--socket", p.socket, "--state-dir", p.state, "--delete-queue-dir", p.queue,
		"--ipv4-range", cidr, "--bpffs", p.bpffs, "--log-level", "debug"}, extra...)
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			data, _ := os.ReadFile(p.log)
			if len(data) > 64<<10 {
				data = data[len(data)-64<<10:]
			}
			t.Logf("agent log (tail):\n%s", data)
		}
	})
	return p
}

// start starts the agent and waits until it is ready (restore done, the
// delete queue drained).
func (p *agentProc) start() {
	p.t.Helper()
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	p.starts++
	fmt.Fprintf(f, "\n===== start %d =====\n", p.starts)
	argv := append(append(append([]string{}, p.wrap...), filepath.Join(binDir, "membrane-agent")), p.args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	start := func() error { return cmd.Start() }
	if p.ns != nil {
		err = p.ns.Do(start) // the child inherits the thread's netns
	} else {
		err = start()
	}
	f.Close()
	if err != nil {
		p.t.Fatalf("start agent: %v", err)
	}
	p.cmd, p.exited = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(p.exited)
	p.waitReady()
}

func (p *agentProc) waitReady() {
	p.t.Helper()
	c := client.New(p.socket)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx, p.exited); err != nil {
		p.t.Fatalf("start agent (%v): %v", p.cmd.ProcessState, err)
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *agentProc) kill() {
	p.t.Helper()
	if p.cmd == nil {
		return
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		p.t.Fatalf("kill agent: %v", err)
	}
	<-p.exited
	p.cmd = nil
}

// stop sends SIGTERM and waits (SIGKILL after 30 s).
func (p *agentProc) stop() {
	if p.cmd == nil {
		return
	}
	testutil.Stop(p.cmd.Process, p.exited, 30*time.Second)
	p.cmd = nil
}

// cniDel runs the membrane-cni binary's DEL as a runtime would (used while
// the agent is down: the plugin queues the deletion).
func cniDel(t *testing.T, p *agentProc, network, containerID, pod string) {
	t.Helper()
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":"membrane-cni","socket":%q,"deleteQueueDir":%q}`,
		network, p.socket, p.queue)
	cmd := exec.Command(filepath.Join(binDir, "membrane-cni"))
	cmd.Env = append(os.Environ(), "CNI_COMMAND=DEL", "CNI_CONTAINERID="+containerID, "CNI_NETNS=", "CNI_IFNAME=eth0",
		"CNI_PATH="+binDir, "CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE="+podNamespace+";K8S_POD_NAME="+pod)
	cmd.Stdin = bytes.NewBufferString(conf)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("CNI DEL %s with the agent down: %v\n%s", containerID, err, out)
	}
}

// podNamespace is the Kubernetes namespace of every test pod.
const podNamespace = "crash"
