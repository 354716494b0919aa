package fqdn

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/restore"
)

// persisted returns the names the agent's fqdn file holds, alive now.
func (e *env) persisted() ([]string, error) {
	data, err := restore.ReadFQDN(e.node.StateDir)
	if err != nil || data == nil {
		return nil, err
	}
	es, err := fqdn.ParseFile(data, time.Now())
	var names []string
	for _, en := range es {
		names = append(names, en.Name)
	}
	return names, err
}

// openConn opens a TCP connection from pod A to ip:80 (the world's echo
// server) and checks one exchange on it.
func (e *env) openConn(ip netip.Addr) net.Conn {
	e.t.Helper()
	var c net.Conn
	err := e.pod.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", netip.AddrPortFrom(ip, 80).String(), 5*time.Second)
		return err
	})
	if err != nil {
		e.t.Fatalf("connect %s:80: %v", ip, err)
	}
	e.t.Cleanup(func() { c.Close() })
	if err := echo(c, "before"); err != nil {
		e.t.Fatalf("first exchange with %s:80: %v", ip, err)
	}
	return c
}

// echo writes msg on c and reads it back (bounded).
func echo(c net.Conn, msg string) error {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return fmt.Errorf("echoed %q, want %q", buf, msg)
	}
	return nil
}

func cached(es []models.FQDNCacheEntry, name string) bool {
	return slices.ContainsFunc(es, func(e models.FQDNCacheEntry) bool { return e.FQDN == name })
}

// TestFQDNAcrossRestart (root, real traffic, the agent as a process):
// the names pod A learned survive an agent SIGKILL and restart. A
// resolves long.test (TTL 300 s) and short.test (TTL 2 s), both under
// toFQDNs, and keeps a TCP connection to long.test's address open; once
// the agent wrote both to <state-dir>/fqdn.json it is SIGKILLed, and
// restarted after short.test's TTL ended. The open connection carries
// data after the restart (the restored endpoint's policy still allows
// the address), a new connection to it passes before A resolves again,
// and the cache holds long.test but not short.test (expired while no
// agent ran: not restored), whose address stays refused.
func TestFQDNAcrossRestart(t *testing.T) {
	e := newEnvProc(t)
	e.importPolicyFQDN(`matchPattern: "*.test"`, `matchName: long.test}, {matchName: short.test`)
	for _, name := range []string{"long.test", "short.test"} {
		if resp, err := e.resolve("udp", name); err != nil || len(resp.Answer) != 1 {
			t.Fatalf("resolve %s: %v %v", name, resp, err)
		}
	}
	conn := e.openConn(allowedIP)
	if err := e.connect(deniedIP); err != nil {
		t.Fatalf("short.test's address before its TTL: %v", err)
	}
	testutil.EventuallyErr(t, "both names in "+restore.FQDNFile, func() error {
		names, err := e.persisted()
		if err != nil || !slices.Contains(names, "long.test.") || !slices.Contains(names, "short.test.") {
			return fmt.Errorf("persisted %v, %v", names, err)
		}
		return nil
	})
	learned := time.Now()
	e.proc.Kill()
	// short.test's lifetime (2 s) ends while no agent runs.
	time.Sleep(time.Until(learned.Add(3 * time.Second)))
	e.proc.Start()
	e.settle()

	if err := echo(conn, "after the restart"); err != nil {
		t.Errorf("the connection opened before the SIGKILL, after the restart: %v", err)
	}
	if err := e.connect(allowedIP); err != nil {
		t.Errorf("a new connection to long.test's address after the restart, without resolving again: %v", err)
	}
	es, err := e.c.FQDNCache(context.Background(), int(e.epID), "")
	if err != nil || !cached(es, "long.test.") || cached(es, "short.test.") {
		t.Errorf("GET /v1/fqdn/cache after the restart = %+v, %v; want long.test. and not short.test.", es, err)
	}
	if err := e.connect(deniedIP); err == nil {
		t.Error("short.test's address reached after the restart: its entry had expired")
	}
}
