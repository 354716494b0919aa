package api_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
)

func startGCAgent(t *testing.T) (*client.Client, string) {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "a.sock")
	a, err := agent.Start(agent.Config{Socket: sock, StateDir: filepath.Join(dir, "state"),
		IPv4Range: netip.MustParsePrefix("10.250.0.0/24"), Datapath: "fake"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = a.Stop(ctx)
	})
	c := client.New(sock)
	t.Cleanup(c.Close)
	return c, sock
}

func createCNIEndpoint(t *testing.T, c *client.Client, cid, netns string) string {
	t.Helper()
	ctx := context.Background()
	ip, err := c.IPAMAllocate(ctx, "ipv4", "default/"+cid)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.EndpointCreate(ctx, "container-id:"+cid, &models.EndpointChangeRequest{
		ContainerInterfaceName: "eth0", Netns: netns, K8sNamespace: "default", K8sPodName: cid,
		Addressing: &models.AddressPair{IPv4: ip.IPv4.IP}, SyncBuild: true, Labels: []string{"k8s:app=" + cid},
	})
	if err != nil {
		t.Fatal(err)
	}
	return ip.IPv4.IP
}

func TestGC(t *testing.T) {
	c, _ := startGCAgent(t)
	ctx := context.Background()
	createCNIEndpoint(t, c, "keep", "/var/run/netns/keep")
	dropIP := createCNIEndpoint(t, c, "drop", "/var/run/netns/drop")
	createCNIEndpoint(t, c, "other-if", "/var/run/netns/other") // eth0 not listed: ifname differs
	// An endpoint not made by the CNI plugin (no netns) is never collected.
	if _, err := c.EndpointCreate(ctx, "container-id:manual", &models.EndpointChangeRequest{SyncBuild: true, Labels: []string{"k8s:app=manual"}}); err != nil {
		t.Fatal(err)
	}

	res, err := c.GC(ctx, []client.GCAttachment{{ContainerID: "keep", IfName: "eth0"}, {ContainerID: "other-if", IfName: "net1"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Deleted) != 2 {
		t.Fatalf("deleted = %v, want 2 endpoints", res.Deleted)
	}
	for ref, want := range map[string]bool{"keep": true, "drop": false, "other-if": false, "manual": true} {
		_, err := c.EndpointGet(ctx, "container-id:"+ref)
		if (err == nil) != want {
			t.Errorf("endpoint %s exists = %v, want %v", ref, err == nil, want)
		}
	}
	st, err := c.IPAMStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range st.IPv4.Allocations {
		if a.IP == dropIP {
			t.Fatalf("GC left %s allocated", dropIP)
		}
	}
	// Idempotent.
	if res, err := c.GC(ctx, []client.GCAttachment{{ContainerID: "keep", IfName: "eth0"}}); err != nil || len(res.Deleted) != 0 {
		t.Fatalf("second GC = %+v, %v", res, err)
	}
}

func TestGCBadRequests(t *testing.T) {
	_, sock := startGCAgent(t)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	for body, want := range map[string]string{
		`{}`: "valid-attachments",
		`{"valid-attachments":[{"container-id":"a"}]}`: "valid-attachments[0]",
		`{"valid-attachments":[],"x":1}`:               "unknown field",
	} {
		resp, err := hc.Post("http://membrane/v1/gc", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(msg), want) {
			t.Errorf("POST /v1/gc %s = %d %s; want 400 naming %q", body, resp.StatusCode, msg, want)
		}
	}
}
