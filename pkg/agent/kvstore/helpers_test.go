package kvstore_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/etcdtest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// node is one simulated agent's kvstore side.
type node struct {
	c  *kvstore.Client
	id *kvstore.IdentityBackend
}

// connect returns a Client to endpoint as node name (prefix per test).
func connect(tb testing.TB, endpoint, name string, mod func(*kvstore.Config)) *kvstore.Client {
	tb.Helper()
	cfg := kvstore.Config{Endpoints: []string{endpoint}, NodeName: name, Prefix: prefixOf(tb),
		LeaseTTL: 2 * time.Second, GCInterval: -1, RequestTimeout: 2 * time.Second, DialTimeout: 2 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	c, err := kvstore.Connect(cfg, quiet)
	if err != nil {
		tb.Fatalf("connect: %v", err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	testutil.Eventually(tb, "node lease of "+name, func() bool { _, ok := c.Lease(); return ok })
	return c
}

func newNode(tb testing.TB, endpoint, name string) *node {
	tb.Helper()
	return newNodeWith(tb, endpoint, name, nil)
}

// newNodeWith is newNode with mod changing the client's configuration.
func newNodeWith(tb testing.TB, endpoint, name string, mod func(*kvstore.Config)) *node {
	tb.Helper()
	c := connect(tb, endpoint, name, mod)
	b := kvstore.NewIdentityBackend(c)
	tb.Cleanup(func() { _ = b.Close() })
	return &node{c: c, id: b}
}

func prefixOf(tb testing.TB) string {
	return "t-" + fmt.Sprint(len(tb.Name())) + "-" + sanitize(tb.Name()) + "/"
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '/' || c == ' ' {
			b[i] = '_'
		}
	}
	return string(b)
}

func labelSet(tb testing.TB, ss ...string) labels.Labels {
	tb.Helper()
	ls, err := labels.ParseSet(ss)
	if err != nil {
		tb.Fatal(err)
	}
	return ls
}

// countKeys counts keys and bytes (key + value) under prefix.
func countKeys(tb testing.TB, cli *clientv3.Client, prefix string) (n, bytes int) {
	tb.Helper()
	resp, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix())
	if err != nil {
		tb.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		bytes += len(kv.Key) + len(kv.Value)
	}
	return len(resp.Kvs), bytes
}

func startEtcd(tb testing.TB) *etcdtest.Server {
	tb.Helper()
	return etcdtest.Start(tb, etcdtest.Options{})
}
