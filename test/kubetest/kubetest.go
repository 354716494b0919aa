// Package kubetest runs a real etcd and kube-apiserver on loopback for the
// integration tests of the Kubernetes mode. The binaries come from
// scripts/kube-bin.sh (built once per machine from the Go module proxy);
// a test package starts one API server in TestMain with Main, and its
// tests take it with Require.
package kubetest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// Version is the Kubernetes release scripts/kube-bin.sh builds.
const Version = "v1.35.4"

// ErrNoBinaries is returned by Start when kube-apiserver or etcd-embed is
// missing from the bin directory.
var ErrNoBinaries = errors.New("kube-apiserver/etcd-embed not built (run scripts/kube-bin.sh)")

// BinDir is where the binaries are: $KUBETEST_BIN, else the cache
// scripts/kube-bin.sh fills ($KUBE_DIR/bin, KUBE_DIR defaulting to
// $HOME/.cache/membrane/kube-v1.35.4).
func BinDir() string {
	if d := os.Getenv("KUBETEST_BIN"); d != "" {
		return d
	}
	if d := os.Getenv("KUBE_DIR"); d != "" {
		return filepath.Join(d, "bin")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "membrane", "kube-"+Version, "bin")
}

// Env is a running etcd + kube-apiserver.
type Env struct {
	// Dir holds certificates, logs and etcd's data; removed by Stop.
	Dir string
	// Config is an admin (system:masters) client configuration.
	Config *rest.Config
	// Kubeconfig is a kubeconfig file for Config, inside Dir.
	Kubeconfig string
	apiserver  *proc
	etcd       *proc
	// apiserverBin and apiserverArgs restart the API server (StartAPIServer)
	// on the same etcd, port and certificates.
	apiserverBin  string
	apiserverArgs []string
	caPEM         []byte
}

var (
	shared    *Env
	sharedErr error
)

// Main starts one API server for the test package, runs m and stops it.
// A missing binary is not an error here: Require skips the tests that
// need it, or fails them under CI.
func Main(m *testing.M) int {
	shared, sharedErr = Start(context.Background(), BinDir())
	if sharedErr != nil && !errors.Is(sharedErr, ErrNoBinaries) {
		fmt.Fprintln(os.Stderr, "kubetest:", sharedErr)
	}
	code := m.Run()
	if shared != nil {
		shared.Stop()
	}
	RemoveChartTool()
	return code
}

// Require returns the package's API server. Without one it skips tb when
// the binaries are absent and CI is unset, and fails it otherwise.
func Require(tb testing.TB) *Env {
	tb.Helper()
	switch {
	case shared != nil:
		return shared
	case errors.Is(sharedErr, ErrNoBinaries) && !testutil.InCI():
		tb.Skipf("kubetest: %v", sharedErr)
	case sharedErr == nil:
		tb.Fatal("kubetest: no API server: call kubetest.Main from TestMain")
	}
	tb.Fatalf("kubetest: %v", sharedErr)
	return nil
}

// Start launches etcd-embed and kube-apiserver from binDir and waits until
// /readyz answers ok. On failure everything started is stopped again.
func Start(ctx context.Context, binDir string, extraArgs ...string) (_ *Env, retErr error) {
	for _, b := range []string{"kube-apiserver", "etcd-embed"} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(binDir, b), ErrNoBinaries)
		}
	}
	dir, err := os.MkdirTemp(os.Getenv("KUBETEST_TMPDIR"), "kubetest")
	if err != nil {
		return nil, fmt.Errorf("start kubetest: %w", err)
	}
	e := &Env{Dir: dir}
	defer func() {
		if retErr != nil {
			e.Stop()
		}
	}()
	caPEM, err := selfSigned(dir)
	if err != nil {
		return nil, fmt.Errorf("start kubetest: serving cert: %w", err)
	}
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("start kubetest: %w", err)
	}
	if err := writePEM(filepath.Join(dir, "sa.key"), "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(sa)); err != nil {
		return nil, fmt.Errorf("start kubetest: %w", err)
	}
	const token = "kubetest-admin-token"
	if err := os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(token+`,admin,admin-uid,"system:masters"`+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("start kubetest: %w", err)
	}
	cport, pport, err := freePort(), freePort(), error(nil)
	if cport == 0 || pport == 0 {
		return nil, errors.New("start kubetest: no free port")
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", cport)
	e.etcd, err = e.run(ctx, filepath.Join(binDir, "etcd-embed"), "etcd.log", "-data-dir", filepath.Join(dir, "etcd"),
		"-listen-client", etcdURL, "-listen-peer", fmt.Sprintf("http://127.0.0.1:%d", pport))
	if err != nil {
		return nil, err
	}
	if err := waitTCP(fmt.Sprintf("127.0.0.1:%d", cport), 60*time.Second); err != nil {
		return nil, fmt.Errorf("start kubetest: etcd: %w (see %s)", err, filepath.Join(dir, "etcd.log"))
	}
	port := freePort()
	e.caPEM, e.apiserverBin = caPEM, filepath.Join(binDir, "kube-apiserver")
	e.apiserverArgs = []string{"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--tls-cert-file=" + filepath.Join(dir, "tls.crt"),
		"--tls-private-key-file=" + filepath.Join(dir, "tls.key"),
		"--token-auth-file=" + filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubetest.local",
		"--service-account-key-file=" + filepath.Join(dir, "sa.key"),
		"--service-account-signing-key-file=" + filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--allow-privileged=true",
		"--disable-admission-plugins=ServiceAccount",
		"--v=" + envOr("KUBETEST_V", "1")}
	e.apiserverArgs = append(e.apiserverArgs, extraArgs...) // a flag given again overrides
	host := fmt.Sprintf("https://127.0.0.1:%d", port)
	e.Config = &rest.Config{Host: host, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: caPEM}, QPS: 100, Burst: 200}
	if err := e.StartAPIServer(ctx); err != nil {
		return nil, fmt.Errorf("start kubetest: %w", err)
	}
	e.Kubeconfig = filepath.Join(dir, "kubeconfig")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: host, CertificateAuthorityData: caPEM}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: "admin"}
	kc.CurrentContext = "kubetest"
	if err := clientcmd.WriteToFile(*kc, e.Kubeconfig); err != nil {
		return nil, fmt.Errorf("start kubetest: kubeconfig: %w", err)
	}
	return e, nil
}

// StopAPIServer kills the API server (SIGKILL, as a crash) and waits for
// it; etcd keeps running. Idempotent.
func (e *Env) StopAPIServer() {
	e.apiserver.kill()
}

// StartAPIServer (re)starts the API server on the same etcd, port and
// certificates and waits until /readyz answers ok. Its log is appended to
// apiserver.log. Returns an error if it is running already.
func (e *Env) StartAPIServer(ctx context.Context) error {
	if e.apiserver.running() {
		return errors.New("start kube-apiserver: already running")
	}
	var err error
	if e.apiserver, err = e.run(ctx, e.apiserverBin, "apiserver.log", e.apiserverArgs...); err != nil {
		return err
	}
	if err := waitReady(ctx, e.Config.Host, e.Config.BearerToken, e.caPEM, 120*time.Second); err != nil {
		return fmt.Errorf("kube-apiserver: %w (see %s)", err, filepath.Join(e.Dir, "apiserver.log"))
	}
	return nil
}

// APIServerPID and EtcdPID are the running kube-apiserver's and etcd's
// process ids (0: not running): benchmarks read their CPU
// (testutil.ProcessCPU).
func (e *Env) APIServerPID() int { return e.apiserver.pid() }

// EtcdPID: see APIServerPID.
func (e *Env) EtcdPID() int { return e.etcd.pid() }

// proc is a started binary; done is closed once it exited and was waited
// for.
type proc struct {
	cmd  *exec.Cmd
	done <-chan struct{}
}

func (p *proc) running() bool {
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *proc) pid() int {
	if !p.running() {
		return 0
	}
	return p.cmd.Process.Pid
}

// kill kills the process and waits for it. Idempotent; nil is a no-op.
func (p *proc) kill() {
	if !p.running() {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// run starts one of the binaries, killed with the test process
// (Pdeathsig) if that dies first. Pdeathsig fires when the thread that
// started the child exits, and tests lock and end threads (netns work),
// so the child is started and waited for by a goroutine locked to its
// own thread, which lives exactly as long as the child.
func (e *Env) run(ctx context.Context, bin, logName string, args ...string) (*proc, error) {
	logf, err := os.OpenFile(filepath.Join(e.Dir, logName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start kubetest: %w", err)
	}
	defer logf.Close() // the child holds its own descriptor
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	cmd.Stdout, cmd.Stderr = logf, logf
	done, err := testutil.StartPinned(cmd)
	if err != nil {
		return nil, fmt.Errorf("start kubetest: %s: %w", filepath.Base(bin), err)
	}
	return &proc{cmd: cmd, done: done}, nil
}

// Stop kills the API server and etcd (their state is thrown away), waits
// for them and removes Dir (kept with KUBETEST_KEEP=1). Idempotent.
func (e *Env) Stop() {
	e.apiserver.kill()
	e.etcd.kill()
	if os.Getenv("KUBETEST_KEEP") == "" {
		_ = os.RemoveAll(e.Dir)
	} else {
		fmt.Fprintln(os.Stderr, "kubetest: kept", e.Dir)
	}
}

func waitReady(ctx context.Context, host, token string, caPEM []byte, timeout time.Duration) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Timeout: 2 * time.Second, Transport: tr}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, host+"/readyz", nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("/readyz: %s", resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready after %s: %w", timeout, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func waitTCP(addr string, timeout time.Duration) error {
	dl := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(dl) {
			return fmt.Errorf("%s not accepting connections after %s: %w", addr, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func freePort() int {
	port, err := testutil.FreePort("127.0.0.1")
	if err != nil {
		return 0
	}
	return port
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// selfSigned writes a self-signed (CA) serving certificate for 127.0.0.1
// and localhost and returns it as PEM.
func selfSigned(dir string) ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kubetest-apiserver"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	if err := writePEM(filepath.Join(dir, "tls.crt"), "CERTIFICATE", der); err != nil {
		return nil, err
	}
	if err := writePEM(filepath.Join(dir, "tls.key"), "EC PRIVATE KEY", kder); err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

// StartOwn starts an API server for tb alone (a test that stops and
// restarts it must not share the package's, or gives it extraArgs),
// stopped at cleanup. Without the binaries it skips tb, or fails it
// under CI.
func StartOwn(tb testing.TB, extraArgs ...string) *Env {
	tb.Helper()
	e, err := Start(context.Background(), BinDir(), extraArgs...)
	switch {
	case errors.Is(err, ErrNoBinaries) && !testutil.InCI():
		tb.Skipf("kubetest: %v", err)
	case err != nil:
		tb.Fatalf("kubetest: %v", err)
	}
	tb.Cleanup(e.Stop)
	return e
}
