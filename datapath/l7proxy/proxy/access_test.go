package proxy

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath/l7proxy"
)

// TestAccessLog: records the proxy queues reach the agent's access
// socket (only its owner may write to it) in order; without a socket
// path nothing is queued.
func TestAccessLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.sock")
	got := make(chan l7proxy.AccessRecord, 4)
	srv, err := l7proxy.NewAccessServer(path, func(r l7proxy.AccessRecord) { got <- r }, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("access socket mode %v %v, want 0600", st.Mode(), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := newAccessLog(path)
	go a.run(ctx)
	want := []l7proxy.AccessRecord{
		{Endpoint: 12, Direction: "ingress", Src: netip.MustParseAddrPort("10.0.0.2:4000"), Dst: netip.MustParseAddrPort("10.0.0.3:80"),
			SrcIdentity: 1001, DstIdentity: 1002, Method: "GET", Path: "/private", Reason: "denied"},
		{Endpoint: 12, Direction: "ingress", Method: "GET", Path: "/public", Allowed: true},
	}
	for _, r := range want {
		a.log(r)
	}
	for i, w := range want {
		select {
		case r := <-got:
			if r.Path != w.Path || r.Allowed != w.Allowed || r.Src != w.Src || r.SrcIdentity != w.SrcIdentity || r.Reason != w.Reason {
				t.Errorf("record %d = %+v, want %+v", i, r, w)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("record %d never arrived", i)
		}
	}
	off := newAccessLog("")
	off.log(want[0])
	if len(off.ch) != 0 {
		t.Errorf("a disabled access log queued a record")
	}
}
