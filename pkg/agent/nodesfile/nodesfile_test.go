package nodesfile

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

func TestParse(t *testing.T) {
	yaml := "- name: b\n  addresses: [192.0.2.2, \"fd00::2\"]\n  podCIDRs: [10.2.0.0/24, \"fd02::/112\"]\n"
	json := `[{"name": "c", "addresses": ["192.0.2.3"], "podCIDRs": ["10.3.0.0/24"]}]`
	for name, in := range map[string]string{"yaml": yaml, "json": json} {
		nodes, err := Parse([]byte(in))
		if err != nil || len(nodes) != 1 {
			t.Fatalf("%s: %v %v", name, nodes, err)
		}
	}
	nodes, _ := Parse([]byte(yaml))
	if n := nodes[0]; n.Name != "b" || n.Addrs[1] != netip.MustParseAddr("fd00::2") || n.PodCIDRs[1] != netip.MustParsePrefix("fd02::/112") {
		t.Fatalf("parsed %+v", n)
	}
	for name, in := range map[string]string{
		"unknown field":  "- name: b\n  address: [192.0.2.2]\n",
		"bad address":    "- name: b\n  addresses: [192.0.2]\n  podCIDRs: [10.2.0.0/24]\n",
		"bad cidr":       "- name: b\n  addresses: [192.0.2.2]\n  podCIDRs: [10.2.0.0/33]\n",
		"not a list":     "name: b\n",
		"unmasked cidr":  "- name: b\n  addresses: [192.0.2.2]\n  podCIDRs: [10.2.0.1/24]\n",
		"duplicate node": "- {name: b, addresses: [192.0.2.2], podCIDRs: [10.2.0.0/24]}\n- {name: b, addresses: [192.0.2.3], podCIDRs: [10.3.0.0/24]}\n",
	} {
		if _, err := Parse([]byte(in)); !errors.Is(err, ErrInvalidFile) {
			t.Errorf("%s: %v, want ErrInvalidFile", name, err)
		}
	}
}

type sink struct {
	mu   sync.Mutex
	sets [][]datapath.RemoteNode
	fail bool
}

func (s *sink) SyncNodes(_ context.Context, source string, nodes []datapath.RemoteNode) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if source != Source {
		return errors.New("wrong source " + source)
	}
	if s.fail {
		s.fail = false
		return errors.New("injected")
	}
	s.sets = append(s.sets, nodes)
	return nil
}

func (s *sink) last() (string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.sets) == 0 {
		return "", 0
	}
	var names []string
	for _, n := range s.sets[len(s.sets)-1] {
		names = append(names, n.Name)
	}
	return strings.Join(names, ","), len(s.sets)
}

// TestWatcher: this node's own entry is skipped; a change is applied; an
// invalid file keeps the last set; a failed sync is retried.
func TestWatcher(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nodes.yaml")
	write := func(s string) {
		if err := os.WriteFile(path+".tmp", []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	self := "- {name: a, addresses: [192.0.2.1], podCIDRs: [10.1.0.0/24]}\n"
	b := "- {name: b, addresses: [192.0.2.2], podCIDRs: [10.2.0.0/24]}\n"
	c := "- {name: c, addresses: [192.0.2.3], podCIDRs: [10.3.0.0/24]}\n"
	write(self + b)
	s := &sink{fail: true}
	w := &Watcher{Path: path, Interval: 5 * time.Millisecond, Local: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24")}, Sink: s,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testutil.Eventually(t, "b applied after the failed sync", func() bool { got, _ := s.last(); return got == "b" })
	write(self + b + c)
	testutil.Eventually(t, "b,c applied", func() bool { got, _ := s.last(); return got == "b,c" })
	write(self + c)
	testutil.Eventually(t, "c applied", func() bool { got, _ := s.last(); return got == "c" })
	// An invalid content applies nothing and is not retried.
	_, n := s.last()
	if !w.apply(ctx, []byte("- {name: broken\n")) {
		t.Fatal("an invalid file is retried")
	}
	if got, m := s.last(); m != n || got != "c" {
		t.Fatalf("after an invalid file: %q (%d sets), want c (%d)", got, m, n)
	}
}
