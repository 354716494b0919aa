package fqdn

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// ipcacheOf is GET /v1/ipcache's identity and source for ip's /32.
func (e *env) ipcacheOf(ip netip.Addr) (uint32, string) {
	e.t.Helper()
	es, err := e.c.IPCache(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	for _, en := range es {
		if en.CIDR == netip.PrefixFrom(ip, 32).String() {
			return en.Identity, en.Source
		}
	}
	return 0, ""
}

// fromHost connects from the node netns, from local address src, to
// addr:port and exchanges a message (a bounded attempt).
func (e *env) fromHost(src, addr netip.Addr, port int) error {
	return e.node.NS.Do(func() error {
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: src.AsSlice()}}
		c, err := d.Dial("tcp", net.JoinHostPort(addr.String(), strconv.Itoa(port)))
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("membrane")); err != nil {
			return err
		}
		_, err = io.ReadFull(c, make([]byte, 8))
		return err
	})
}

// TestFQDNAnswerNamingNode (root, real traffic): pod A's toFQDNs
// node.test, whose DNS answer (through the DNS proxy) is the node's own
// address. The address keeps reserved:host in the ipcache: A is not
// allowed to the node by the toFQDNs rule, and pod B, which admits
// fromEntities host, still accepts the node from that address.
func TestFQDNAnswerNamingNode(t *testing.T) {
	e := newEnv(t)
	node := nodeSide.Addr()
	testutil.EchoServer(t, e.node.NS, node, 80)
	podB, ipB, _, _ := e.addPod("b")
	testutil.EchoServer(t, podB, ipB, 80)
	doc := `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: host-in, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: b}}
  ingress:
  - fromEntities: [host]
`
	if _, err := e.c.PolicyImport(context.Background(), []byte(doc), "application/yaml"); err != nil {
		t.Fatalf("import policy: %v", err)
	}
	e.importPolicyFQDN(`matchPattern: "*.test"`, "matchName: node.test")
	testutil.Eventually(t, "the node's address is host", func() bool {
		id, src := e.ipcacheOf(node)
		return id == uint32(identity.ReservedHost) && src == index.SourceReserved
	})
	testutil.Eventually(t, "B admits the host", func() bool { return e.fromHost(node, ipB, 80) == nil })
	if err := e.connect(node); err == nil {
		t.Fatal("A reaches the node before resolving node.test")
	}

	resp, err := e.resolve("udp", "node.test")
	if ip, ok := answerIP(resp); err != nil || !ok || ip != node {
		t.Fatalf("node.test = %v, %v; want %s", resp, err, node)
	}
	if id, src := e.ipcacheOf(node); id != uint32(identity.ReservedHost) || src != index.SourceReserved {
		t.Fatalf("after the DNS answer the node's address is identity %d from %q; want host from reserved", id, src)
	}
	if err := e.connect(node); err == nil {
		t.Fatal("A reaches the node after resolving node.test: the toFQDNs rule must not allow the host")
	}
	if err := e.fromHost(node, ipB, 80); err != nil {
		t.Fatalf("B no longer admits the host from %s after the DNS answer: %v", node, err)
	}
	// The rule still works for an address that is nobody's.
	e.importPolicyFQDN(`matchPattern: "*.test"`, "matchPattern: \"*.test\"")
	resp, err = e.resolve("udp", "allowed.test")
	if ip, ok := answerIP(resp); err != nil || !ok || ip != allowedIP {
		t.Fatalf("allowed.test = %v, %v", resp, err)
	}
	if err := e.connect(allowedIP); err != nil {
		t.Fatal(fmt.Errorf("A does not reach allowed.test's address: %w", err))
	}
}
