package kvstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/etcdtest"
)

// TestLeaseExpiryDropsReferences: a node that dies holding references
// loses them when its lease expires; GC then removes what nobody else
// references and keeps what another node still uses.
func TestLeaseExpiryDropsReferences(t *testing.T) {
	srv := startEtcd(t)
	dead := connect(t, srv.Endpoint, "dies", nil)
	deadIDs := kvstore.NewIdentityBackend(dead)
	live := connect(t, srv.Endpoint, "lives", func(c *kvstore.Config) { c.GCGrace = time.Nanosecond })
	liveIDs := kvstore.NewIdentityBackend(live)
	t.Cleanup(func() { _ = liveIDs.Close() })
	only := labelSet(t, "k8s:app=only-dead")
	shared := labelSet(t, "k8s:app=shared")
	onlyID, _, err := deadIDs.Acquire(context.Background(), only)
	if err != nil {
		t.Fatal(err)
	}
	sharedID, _, err := deadIDs.Acquire(context.Background(), shared)
	if err != nil {
		t.Fatal(err)
	}
	if got, _, err := liveIDs.Acquire(context.Background(), shared); err != nil || got != sharedID {
		t.Fatalf("live node got %d, %v; want %d", got, err, sharedID)
	}
	_ = deadIDs.Close()
	_ = dead.Close() // no revoke: the lease runs out
	p := prefixOf(t) + "state/identities/v1/"
	testutil.Eventually(t, "the dead node's references expire", func() bool {
		n, _ := countKeys(t, live.Etcd(), p+"refs/")
		return n == 1
	})
	testutil.Eventually(t, "gc removes the unreferenced identity", func() bool {
		if _, err := liveIDs.CollectGarbage(context.Background()); err != nil {
			t.Fatal(err)
		}
		n, _ := countKeys(t, live.Etcd(), fmt.Sprintf("%sid/%d", p, onlyID))
		return n == 0
	})
	assertIdentity(t, live.Etcd(), p, sharedID, shared, "lives")
}

// TestEtcdRestart stops etcd mid-run: a new label set fails with
// ErrUnavailable within the caller's bound (the identity actor retries),
// the status turns unhealthy, the mirrored endpoints stay with the agent,
// and after etcd restarts on the same data directory every identity,
// reference and published endpoint is back (a change made during the
// outage too) and new allocations work.
func TestEtcdRestart(t *testing.T) {
	srv := startEtcd(t)
	a := newNode(t, srv.Endpoint, "restart-a")
	b := startAgentNode(t, srv.Endpoint, "restart-b", 1)
	watcher := startAgentNode(t, srv.Endpoint, "restart-w", 2)
	sets := []string{"k8s:app=r1", "k8s:app=r2", "k8s:app=r3"}
	ids := map[string]identity.NumericIdentity{}
	for _, s := range sets {
		id, _, err := a.id.Acquire(context.Background(), labelSet(t, s))
		if err != nil {
			t.Fatal(err)
		}
		ids[s] = id
	}
	b.src.set(1, podIP(1, 0), ids["k8s:app=r1"], endpoint.StateReady)
	want := map[netip.Addr]identity.NumericIdentity{podIP(1, 0): ids["k8s:app=r1"]}
	testutil.Eventually(t, "watcher sees b's endpoint", func() bool { ips, _ := watcher.sink.view(); return len(ips) == 1 })

	srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	_, _, err := a.id.Acquire(ctx, labelSet(t, "k8s:app=during-outage"))
	cancel()
	if !errors.Is(err, kvstore.ErrUnavailable) {
		t.Fatalf("acquire during the outage: %v; want ErrUnavailable", err)
	}
	testutil.Eventually(t, "status unhealthy", func() bool { return !a.id.Status().Healthy })
	// The agent keeps its view while etcd is gone.
	if ips, _ := watcher.sink.view(); len(ips) != 1 {
		t.Fatalf("watcher lost b's endpoint during the outage: %v", ips)
	}
	b.src.set(2, podIP(1, 1), ids["k8s:app=r2"], endpoint.StateReady) // a change made during the outage
	want[podIP(1, 1)] = ids["k8s:app=r2"]

	srv.Restart()
	testutil.Eventually(t, "status healthy", func() bool { return a.id.Status().Healthy })
	for _, s := range sets {
		got, _, err := a.id.Acquire(context.Background(), labelSet(t, s))
		if err != nil || got != ids[s] {
			t.Fatalf("after restart %s = %d, %v; want %d", s, got, err, ids[s])
		}
		assertIdentity(t, a.c.Etcd(), prefixOf(t)+"state/identities/v1/", ids[s], labelSet(t, s), "restart-a")
	}
	if _, _, err := a.id.Acquire(context.Background(), labelSet(t, "k8s:app=after-outage")); err != nil {
		t.Fatalf("acquire after restart: %v", err)
	}
	expectView(t, []*agentNode{b, watcher}, want, map[netip.Addr]int{podIP(1, 0): 0, podIP(1, 1): 0}, []int{0, 1})
}

// TestIdentityWatchRelists: a Watch consumer cut off while identities are
// created and collected, with the history compacted, converges after
// reconnecting: collected identities are deleted, new ones upserted.
func TestIdentityWatchRelists(t *testing.T) {
	srv := startEtcd(t)
	proxy := etcdtest.NewProxy(t, srv.Endpoint[len("http://"):])
	writer := connect(t, srv.Endpoint, "writer", func(c *kvstore.Config) { c.GCGrace = time.Nanosecond })
	wb := kvstore.NewIdentityBackend(writer)
	t.Cleanup(func() { _ = wb.Close() })
	reader := newNode(t, "http://"+proxy.Addr, "reader")
	var mu sync.Mutex
	seen := map[identity.NumericIdentity]string{}
	synced := false
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = reader.id.Watch(ctx, func(ev identity.ClusterEvent) {
			mu.Lock()
			defer mu.Unlock()
			switch ev.Kind {
			case identity.ClusterUpsert:
				seen[ev.ID] = ev.Labels.Key()
			case identity.ClusterDelete:
				delete(seen, ev.ID)
			case identity.ClusterSynced:
				synced = true
			}
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	old, _, err := wb.Acquire(context.Background(), labelSet(t, "k8s:app=old"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "reader synced with old", func() bool { mu.Lock(); defer mu.Unlock(); return synced && seen[old] != "" })

	proxy.Cut()
	if err := wb.Release(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	for range 2 { // mark, then sweep
		if _, err := wb.CollectGarbage(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	fresh, _, err := wb.Acquire(context.Background(), labelSet(t, "k8s:app=new"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := writer.Etcd().Get(context.Background(), "probe")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Etcd().Compact(context.Background(), resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	proxy.Restore()
	testutil.Eventually(t, "reader converged", func() bool {
		mu.Lock()
		defer mu.Unlock()
		_, hasOld := seen[old]
		return !hasOld && seen[fresh] == "k8s:app=new" && len(seen) == 1
	})
}

// TestTLS: a TLS etcd requiring client certificates is reached with
// --etcd-ca/--etcd-cert/--etcd-key and refused without a client
// certificate or with the wrong CA.
func TestTLS(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{TLS: true})
	withCerts := func(ca, cert, key string) func(*kvstore.Config) {
		return func(c *kvstore.Config) { c.CAFile, c.CertFile, c.KeyFile = ca, cert, key }
	}
	ok := connect(t, srv.Endpoint, "tls-ok", withCerts(srv.TLS.CA, srv.TLS.ClientCert, srv.TLS.ClientKey))
	b := kvstore.NewIdentityBackend(ok)
	t.Cleanup(func() { _ = b.Close() })
	if _, _, err := b.Acquire(context.Background(), labelSet(t, "k8s:app=tls")); err != nil {
		t.Fatalf("acquire over TLS: %v", err)
	}
	for name, mod := range map[string]func(*kvstore.Config){
		"no client cert": withCerts(srv.TLS.CA, "", ""),
		"wrong CA":       withCerts(srv.TLS.OtherCA, srv.TLS.ClientCert, srv.TLS.ClientKey),
	} {
		t.Run(name, func(t *testing.T) {
			cfg := kvstore.Config{Endpoints: []string{srv.Endpoint}, NodeName: "tls-bad", Prefix: prefixOf(t),
				DialTimeout: time.Second, RequestTimeout: time.Second}
			mod(&cfg)
			c, err := kvstore.Connect(cfg, quiet)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if _, err := c.Etcd().Get(ctx, "x"); err == nil {
				t.Fatal("etcd answered a client it should refuse")
			}
			if _, ok := c.Lease(); ok {
				t.Fatal("refused client holds a lease")
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	good := kvstore.Config{Endpoints: []string{"http://127.0.0.1:2379"}, NodeName: "n1"}
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	for name, mod := range map[string]func(*kvstore.Config){
		"no endpoints": func(c *kvstore.Config) { c.Endpoints = nil },
		"bad scheme":   func(c *kvstore.Config) { c.Endpoints = []string{"unix:///x"} },
		"no host":      func(c *kvstore.Config) { c.Endpoints = []string{"http://"} },
		"bad node":     func(c *kvstore.Config) { c.NodeName = "Node/1" },
		"empty node":   func(c *kvstore.Config) { c.NodeName = "" },
		"cert alone":   func(c *kvstore.Config) { c.CertFile = "/x.pem" },
		"missing CA": func(c *kvstore.Config) {
			c.CAFile = "/nonexistent/ca.pem"
			c.Endpoints = []string{"https://127.0.0.1:2379"}
		},
		"short ttl":      func(c *kvstore.Config) { c.LeaseTTL = time.Second },
		"prefix no /":    func(c *kvstore.Config) { c.Prefix = "membrane" },
		"absolute /pref": func(c *kvstore.Config) { c.Prefix = "/membrane/" },
	} {
		t.Run(name, func(t *testing.T) {
			c := good
			mod(&c)
			if err := c.Validate(); !errors.Is(err, kvstore.ErrInvalidConfig) {
				t.Fatalf("Validate = %v; want ErrInvalidConfig", err)
			}
		})
	}
}

// TestConfigRefusesTLSWithHTTP: TLS files with an http:// endpoint are a
// configuration error naming the flags and the endpoint (the etcd client
// would connect to it in plaintext, ignoring the files).
func TestConfigRefusesTLSWithHTTP(t *testing.T) {
	pki := etcdtest.WriteCerts(t, t.TempDir())
	for name, tc := range map[string]struct {
		mod  func(*kvstore.Config)
		want []string
	}{
		"ca":          {func(c *kvstore.Config) { c.CAFile = pki.CA }, []string{"--etcd-ca", "http://10.0.0.1:2379"}},
		"client cert": {func(c *kvstore.Config) { c.CertFile, c.KeyFile = pki.ClientCert, pki.ClientKey }, []string{"--etcd-cert", "--etcd-key", "http://10.0.0.1:2379"}},
		"one of two": {func(c *kvstore.Config) {
			c.CAFile = pki.CA
			c.Endpoints = []string{"https://10.0.0.2:2379", "http://10.0.0.1:2379"}
		}, []string{"--etcd-ca", "http://10.0.0.1:2379"}},
	} {
		t.Run(name, func(t *testing.T) {
			c := kvstore.Config{Endpoints: []string{"http://10.0.0.1:2379"}, NodeName: "n1"}
			tc.mod(&c)
			err := c.Validate()
			if !errors.Is(err, kvstore.ErrInvalidConfig) {
				t.Fatalf("Validate = %v; want ErrInvalidConfig", err)
			}
			for _, w := range append(tc.want, "--etcd-endpoints") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %s", err, w)
				}
			}
		})
	}
	https := kvstore.Config{Endpoints: []string{"https://10.0.0.1:2379"}, NodeName: "n1", CAFile: pki.CA, CertFile: pki.ClientCert, KeyFile: pki.ClientKey}
	if err := https.Validate(); err != nil {
		t.Fatalf("https with TLS files: %v", err)
	}
}

// TestLeaseLostAndRegranted cuts one node off etcd for longer than its
// lease: the other nodes drop its endpoints and its identity references
// go, and GC even collects its identity; when the node reaches etcd
// again it is granted a new lease and writes everything again: its node
// entry and endpoints reappear everywhere and its identity comes back
// with the same number and labels.
func TestLeaseLostAndRegranted(t *testing.T) {
	srv := startEtcd(t)
	proxy := etcdtest.NewProxy(t, srv.Endpoint[len("http://"):])
	a := startAgentNode(t, "http://"+proxy.Addr, "regrant-a", 0)
	aIDs := kvstore.NewIdentityBackend(a.c)
	t.Cleanup(func() { _ = aIDs.Close() })
	b := startAgentNode(t, srv.Endpoint, "regrant-b", 1)
	gcClient := connect(t, srv.Endpoint, "regrant-gc", func(c *kvstore.Config) { c.GCGrace = time.Nanosecond })
	gc := kvstore.NewIdentityBackend(gcClient)
	t.Cleanup(func() { _ = gc.Close() })

	ls := labelSet(t, "k8s:app=regrant")
	id, _, err := aIDs.Acquire(context.Background(), ls)
	if err != nil {
		t.Fatal(err)
	}
	a.src.set(1, podIP(0, 0), id, endpoint.StateReady)
	nodes := []*agentNode{a, b}
	want, owner := map[netip.Addr]identity.NumericIdentity{podIP(0, 0): id}, map[netip.Addr]int{podIP(0, 0): 0}
	expectView(t, nodes, want, owner, []int{0, 1})

	proxy.Cut()
	p := prefixOf(t) + "state/identities/v1/"
	testutil.Eventually(t, "a's lease expires: b drops a", func() bool {
		ips, names := b.sink.view()
		return len(ips) == 0 && len(names) == 0
	})
	testutil.Eventually(t, "gc collects a's identity", func() bool {
		if _, err := gc.CollectGarbage(context.Background()); err != nil {
			t.Fatal(err)
		}
		n, _ := countKeys(t, gcClient.Etcd(), fmt.Sprintf("%sid/%d", p, id))
		return n == 0
	})
	proxy.Restore()
	expectView(t, nodes, want, owner, []int{0, 1})
	testutil.Eventually(t, "a's reference and identity are back", func() bool {
		n, _ := countKeys(t, gcClient.Etcd(), p+"refs/"+kvstore.RefHash(ls.Key())+"/regrant-a")
		return n == 1
	})
	assertIdentity(t, gcClient.Etcd(), p, id, ls, "regrant-a")
	if h := a.c.Health(); h.Regrants == 0 {
		t.Errorf("a's health counts no new lease: %+v", h)
	}
}

// TestWatchSendsResumed: once etcd answers again after an outage, the
// identity watch sends ClusterResumed, so the agent retries waiting label
// sets at once.
func TestWatchSendsResumed(t *testing.T) {
	srv := startEtcd(t)
	n := newNode(t, srv.Endpoint, "resumed")
	var mu sync.Mutex
	resumed, synced := 0, false
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = n.id.Watch(ctx, func(ev identity.ClusterEvent) {
			mu.Lock()
			defer mu.Unlock()
			switch ev.Kind {
			case identity.ClusterSynced:
				synced = true
			case identity.ClusterResumed:
				resumed++
			}
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	testutil.Eventually(t, "synced and healthy", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return synced && n.id.Status().Healthy
	})
	mu.Lock()
	before := resumed
	mu.Unlock()
	srv.Stop()
	testutil.Eventually(t, "status unhealthy", func() bool { return !n.id.Status().Healthy })
	srv.Restart()
	testutil.Eventually(t, "ClusterResumed after the restart", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return resumed > before
	})
}
