package agent

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"testing"
)

// TestComponentNames: the names stopFirst orders are components' names,
// each component named once.
func TestComponentNames(t *testing.T) {
	s := &starter{a: &Agent{}}
	seen := map[string]bool{}
	for _, c := range s.components() {
		if seen[c.name] {
			t.Errorf("component %q listed twice", c.name)
		}
		seen[c.name] = true
	}
	for _, name := range stopFirst {
		if !seen[name] {
			t.Errorf("stopFirst names %q, which is no component", name)
		}
	}
}

// TestComponentOrder: a failing start stops the started components in
// reverse order before the API serves, and as Stop does (stopFirst, then
// reverse) once it serves.
func TestComponentOrder(t *testing.T) {
	for _, tc := range []struct {
		name  string
		names []string // started before "fails"
		want  []string
	}{
		{"before the API", []string{"datapath", "kvstore", "actors"}, []string{"actors", "kvstore", "datapath"}},
		{"API serving", []string{"datapath", "kvstore", "actors", "api", "http", "delete-queue", "kvstore-publish"},
			[]string{"kvstore-publish", "kvstore", "delete-queue", "http", "api", "actors", "datapath"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &Agent{log: slog.New(slog.DiscardHandler)}
			var got []string
			var cs []component
			for _, name := range tc.names {
				start := func() error { return nil }
				if name == "api" {
					start = func() error { a.served = make(chan error, 1); return nil }
				}
				cs = append(cs, component{name, start, func(context.Context) error { got = append(got, name); return nil }})
			}
			boom := errors.New("boom")
			cs = append(cs, component{"fails", func() error { return boom }, nil},
				component{"never", func() error { t.Error("started after a failure"); return nil }, nil})
			if err := a.run(cs); !errors.Is(err, boom) || err.Error() != "start agent: boom" {
				t.Fatalf("run: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("stopped %v, want %v", got, tc.want)
			}
		})
	}
}
