package sim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/etcdtest"
)

// simEtcd is the etcd the nodes of a multi-node run share; it can be
// taken down and brought back on the same data directory and ports.
type simEtcd interface {
	// endpoint is the client URL.
	endpoint() string
	// restart takes etcd down (a graceful stop for the embedded one, a
	// SIGKILL for a process), waits down and starts it again.
	restart(down time.Duration) error
	stop()
	// pid is etcd's process id (0: embedded in this process).
	pid() int
}

// startSimEtcd starts the embedded etcd (bin empty) or the etcd binary
// bin as a child process, with its data under dir/etcd.
func startSimEtcd(dir, bin string) (simEtcd, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	cu, pu := url.URL{Scheme: "http", Host: ports[0]}, url.URL{Scheme: "http", Host: ports[1]}
	data := filepath.Join(dir, "etcd")
	if bin != "" {
		p := &procEtcd{bin: bin, data: data, log: filepath.Join(dir, "etcd.log"), client: cu, peer: pu}
		return p, p.start()
	}
	s := embeddedEtcd{etcdtest.NewMember("membrane-sim", data, cu, pu, nil)}
	return s, s.Start()
}

func freePorts(n int) ([]string, error) {
	ports := make([]string, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("etcd port: %w", err)
		}
		ports[i] = l.Addr().String()
		_ = l.Close()
	}
	return ports, nil
}

// embeddedEtcd runs etcd in this process (test/etcdtest's Member); its
// restarts are graceful stops.
type embeddedEtcd struct{ *etcdtest.Member }

func (s embeddedEtcd) endpoint() string                 { return s.Endpoint }
func (s embeddedEtcd) stop()                            { s.Stop() }
func (s embeddedEtcd) restart(down time.Duration) error { return s.Restart(down) }
func (s embeddedEtcd) pid() int                         { return 0 }

// procEtcd runs an etcd binary as a child process: etcd-embed (built by
// scripts/kube-bin.sh; Go-style flags) or etcd itself (Debian's etcd-server
// or upstream). Its restarts are SIGKILLs: etcd gets no chance to flush or
// close anything, and comes back from its data directory.
type procEtcd struct {
	bin, data, log string
	client, peer   url.URL
	// mu guards p.
	mu sync.Mutex
	p  *etcdProc
}

// etcdProc is one started etcd; done is closed once it exited and was
// waited for.
type etcdProc struct {
	cmd  *exec.Cmd
	done <-chan struct{}
}

func (s *procEtcd) endpoint() string { return s.client.String() }

func (s *procEtcd) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p == nil {
		return 0
	}
	return s.p.cmd.Process.Pid
}

// args are the binary's flags: etcd-embed's own, else etcd's.
func (s *procEtcd) args() []string {
	cu, pu := s.client.String(), s.peer.String()
	if filepath.Base(s.bin) == "etcd-embed" {
		return []string{"-data-dir", s.data, "-listen-client", cu, "-listen-peer", pu}
	}
	return []string{"--name", "membrane-sim", "--data-dir", s.data, "--listen-client-urls", cu, "--advertise-client-urls", cu,
		"--listen-peer-urls", pu, "--initial-advertise-peer-urls", pu, "--initial-cluster", "membrane-sim=" + pu,
		"--unsafe-no-fsync", "--log-level", "warn"}
}

// start runs the binary and waits until /health says true (retrying a
// process that exits early, e.g. while its ports linger after a kill).
func (s *procEtcd) start() error {
	var err error
	for range 20 {
		var p *etcdProc
		if p, err = s.spawn(); err != nil {
			return err
		}
		if err = waitHealthy(s.client.String()+"/health", p.done, 60*time.Second); err == nil {
			s.mu.Lock()
			s.p = p
			s.mu.Unlock()
			return nil
		}
		p.kill()
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("start %s: %w (see %s)", s.bin, err, s.log)
}

// spawn starts the child, killed with this process (Pdeathsig) if that
// dies first. Pdeathsig fires when the thread that started the child
// exits, so the child is started and waited for by a goroutine locked to
// its own thread, which lives exactly as long as the child.
func (s *procEtcd) spawn() (*etcdProc, error) {
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start etcd: %w", err)
	}
	defer logf.Close() // the child holds its own descriptor
	cmd := exec.Command(s.bin, s.args()...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	cmd.Stdout, cmd.Stderr = logf, logf
	done, err := testutil.StartPinned(cmd)
	if err != nil {
		return nil, fmt.Errorf("start etcd: %s: %w", s.bin, err)
	}
	return &etcdProc{cmd: cmd, done: done}, nil
}

// kill sends SIGKILL and waits for the process.
func (p *etcdProc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// waitHealthy polls etcd's /health until it reports true, the process
// exits, or timeout passes.
func waitHealthy(u string, exited <-chan struct{}, timeout time.Duration) error {
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-exited:
			return errors.New("etcd exited")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		resp, err := hc.Do(req)
		if err == nil {
			var body [64]byte
			n, _ := resp.Body.Read(body[:])
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(body[:n]), `"health":"true"`) {
				cancel()
				return nil
			}
			err = fmt.Errorf("/health: %s %q", resp.Status, body[:n])
		}
		cancel()
		if time.Now().After(deadline) {
			return fmt.Errorf("not healthy after %s: %w", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *procEtcd) stop() {
	s.mu.Lock()
	p := s.p
	s.p = nil
	s.mu.Unlock()
	if p != nil {
		p.kill()
	}
}

// restart SIGKILLs etcd, waits down, and starts it again on the same data
// directory and ports.
func (s *procEtcd) restart(down time.Duration) error {
	s.stop()
	time.Sleep(down)
	return s.start()
}
