package cni_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/client"
	"github.com/membrane-cni/membrane/pkg/identity"
	"github.com/membrane-cni/membrane/pkg/models"
	"github.com/membrane-cni/membrane/pkg/policy"
	"github.com/membrane-cni/membrane/test/policyscenario"
)

// policyPod is a pod made by the CNI plugin, with its endpoint.
type policyPod struct {
	*pod
	ip netip.Addr
	ep *models.Endpoint
}

// deniedDial bounds a connection attempt that policy drops (the SYN
// never gets an answer): a bound for the negative check, not a timing
// assertion.
const deniedDial = 1500 * time.Millisecond

// addPolicyPod runs CNI ADD for a pod and labels its endpoint, as the
// agent's Kubernetes watcher would from the pod's labels.
func (e *env) addPolicyPod(c *client.Client, name string, labels ...string) *policyPod {
	e.t.Helper()
	p := e.newPod(name)
	res := e.mustAdd(p)
	ip, ok := netip.AddrFromSlice(res.IPs[0].Address.IP.To4())
	if !ok {
		e.t.Fatalf("pod %s: no IPv4 address in %v", name, res)
	}
	ep, err := c.EndpointPatchLabels(context.Background(), "container-id:"+p.rt.ContainerID, labels, nil)
	if err != nil {
		e.t.Fatalf("label pod %s: %v", name, err)
	}
	return &policyPod{pod: p, ip: ip, ep: ep}
}

// listen serves an echo on ip:port inside the pod's netns.
func (p *policyPod) listen(t *testing.T, port int) {
	t.Helper()
	var ln net.Listener
	if err := p.ns.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(p.ip.String(), strconv.Itoa(port)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
}

// talk connects from p to dst:port and exchanges a message both ways:
// the request passes dst's ingress policy and the reply p's (conntrack).
func (p *policyPod) talk(dst *policyPod, port int, timeout time.Duration) error {
	return p.ns.Do(func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(dst.ip.String(), strconv.Itoa(port)), timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		msg := []byte("membrane")
		if _, err := c.Write(msg); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, make([]byte, len(msg))); err != nil {
			return fmt.Errorf("read reply: %w", err)
		}
		return nil
	})
}

func mustTalk(t *testing.T, from, to *policyPod, port int) {
	t.Helper()
	if err := from.talk(to, port, 5*time.Second); err != nil {
		t.Errorf("%s -> %s:%d: %v; want it to pass", from.rt.Args[2][1], to.rt.Args[2][1], port, err)
	}
}

func mustNotTalk(t *testing.T, from, to *policyPod, port int) {
	t.Helper()
	if err := from.talk(to, port, deniedDial); err == nil {
		t.Errorf("%s -> %s:%d passed; want it dropped", from.rt.Args[2][1], to.rt.Args[2][1], port)
	}
}

// TestPolicyEndToEnd is issue #4's end-to-end test: three pods made by
// the CNI plugin on an agent with the Linux datapath and its BPF
// programs, policy imported through the API, real TCP between the pods.
func TestPolicyEndToEnd(t *testing.T) {
	e := newEnv(t, "10.231.0.0/24")
	e.startAgent(nil)
	c := e.client()
	a := e.addPolicyPod(c, "pod-a", "k8s:app=a", "k8s:instance=a")
	b := e.addPolicyPod(c, "pod-b", "k8s:app=b", "k8s:instance=b")
	cc := e.addPolicyPod(c, "pod-c", "k8s:app=c", "k8s:instance=c")
	b.listen(t, 8080)
	b.listen(t, 8081)
	a.listen(t, 9000)
	idA := identity.NumericIdentity(a.ep.Identity.ID)

	t.Run("no policy: everything passes", func(t *testing.T) {
		mustTalk(t, a, b, 8080)
		mustTalk(t, a, b, 8081)
		mustTalk(t, cc, b, 8080)
		mustTalk(t, b, a, 9000)
	})
	bEnforced := func(t *testing.T, what string, allowed ...identity.NumericIdentity) {
		t.Helper()
		policyscenario.WaitRealized(t, c, b.ep.ID, what, func(m *policy.MapState) bool {
			for _, id := range allowed {
				if !m.Allows(id, 8080, policy.ProtoTCP, policy.Ingress) {
					return false
				}
			}
			return m.Enforced(policy.Ingress)
		})
	}
	t.Run("A may reach B on TCP 8080 only", func(t *testing.T) {
		if _, err := c.PolicyImport(context.Background(), []byte(policyscenario.CNPAllowAToB), client.ContentTypeYAML); err != nil {
			t.Fatal(err)
		}
		bEnforced(t, "A allowed into B on 8080", idA)
		mustTalk(t, a, b, 8080)
		mustNotTalk(t, a, b, 8081)
		mustNotTalk(t, cc, b, 8080)
		mustTalk(t, b, a, 9000) // B's egress and A's ingress are not enforced
	})
	t.Run("deleting the policy restores traffic", func(t *testing.T) {
		if _, err := c.PolicyDelete(context.Background(), "default/a-to-b"); err != nil {
			t.Fatal(err)
		}
		policyscenario.WaitRealized(t, c, b.ep.ID, "allow-all", func(m *policy.MapState) bool { return !m.Enforced(policy.Ingress) })
		mustTalk(t, cc, b, 8080)
		mustTalk(t, a, b, 8081)
	})
	t.Run("relabelling C to app=a lets it in", func(t *testing.T) {
		if _, err := c.PolicyImport(context.Background(), []byte(policyscenario.CNPAllowAToB), client.ContentTypeYAML); err != nil {
			t.Fatal(err)
		}
		bEnforced(t, "the policy back", idA)
		mustNotTalk(t, cc, b, 8080)
		ep, err := c.EndpointPatchLabels(context.Background(), fmt.Sprint(cc.ep.ID), []string{"k8s:app=a"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		bEnforced(t, "C's new identity allowed into B", idA, identity.NumericIdentity(ep.Identity.ID))
		mustTalk(t, cc, b, 8080)
		mustNotTalk(t, cc, b, 8081)
	})
}
