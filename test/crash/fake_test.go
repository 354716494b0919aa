package crash

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// clientDriver makes attachments through pkg/clients/client as membrane-cni
// does: allocate, create the endpoint (sync), release the address if the
// creation failed; DEL deletes by container ID.
type clientDriver struct {
	t     *testing.T
	agent *agentProc
	c     *client.Client
}

func (d *clientDriver) add(ctx context.Context, p *pod) error {
	ipr, err := d.c.IPAMAllocate(ctx, "ipv4", podNamespace+"/"+p.name)
	if err != nil {
		return err
	}
	_, err = d.c.EndpointCreate(ctx, "container-id:"+p.containerID, &models.EndpointChangeRequest{
		K8sNamespace: podNamespace, K8sPodName: p.name, Labels: []string{"k8s:app=app" + strconv.Itoa(len(p.name)%3)},
		Addressing: ipr.Address, SyncBuild: true, ContainerInterfaceName: "eth0",
	})
	if err != nil {
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = d.c.IPAMReleaseOwned(rctx, ipr.Address.IPv4, podNamespace+"/"+p.name)
		cancel()
	}
	return err
}

func (d *clientDriver) del(ctx context.Context, p *pod) error {
	err := d.c.EndpointDeleteByContainer(ctx, p.containerID)
	if client.IsNotFound(err) {
		return nil
	}
	return err
}

func (d *clientDriver) delDown(p *pod) { cniDel(d.t, d.agent, "crash-fake", p.containerID, p.name) }

// TestCrashFake: the agent (fake datapath) is killed with SIGKILL at a
// random moment of a churn of ADDs and DELs, DELs are made while it is
// down, and it is restarted; the invariants hold after every restart.
func TestCrashFake(t *testing.T) {
	iterations := 20
	if testing.Short() {
		iterations = 5
	}
	ap := newAgentProc(t, "10.250.0.0/24", "--datapath", "fake", "--gc-interval", "200ms")
	ap.Start()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	w := newWorld(seed)
	for i := range iterations {
		c := client.New(ap.Socket)
		d := &clientDriver{t: t, agent: ap, c: c}
		ctx, cancel := context.WithCancel(context.Background())
		wg := w.churn(ctx, d, 4)
		time.Sleep(time.Duration(20+w.intN(300)) * time.Millisecond)
		ap.Kill()
		cancel()
		wg.Wait()
		c.Close()
		for range w.intN(3) {
			if p := w.pickLive(podQueued); p != nil {
				d.delDown(p)
			}
		}
		before := persisted(t, ap.StateDir)
		ap.Start()
		c = client.New(ap.Socket)
		checkRestart(t, c, w, ap.StateDir, before)
		if q, _ := os.ReadDir(ap.DeleteQueue); len(q) != 0 {
			t.Fatalf("iteration %d: %d delete queue entries left after start", i, len(q))
		}
		c.Close()
		if t.Failed() {
			return
		}
	}
	t.Log(w.summary())
}
