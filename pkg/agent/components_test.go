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
		name   string
		serves bool
		want   []string
	}{
		{"before the API", false, []string{"http", "api", "kvstore-publish", "kvstore", "actors", "datapath"}},
		{"API serving", true, []string{"kvstore-publish", "kvstore", "http", "api", "actors", "datapath"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			c := func(name string) component {
				return component{name, func() error { return nil }, func(context.Context) error { got = append(got, name); return nil }}
			}
			a := &Agent{log: slog.New(slog.DiscardHandler)}
			if tc.serves {
				a.served = make(chan error, 1)
			}
			boom := errors.New("boom")
			cs := []component{c("datapath"), c("kvstore"), c("actors"), c("api"), c("http"), c("kvstore-publish"),
				{"fails", func() error { return boom }, nil}, c("never")}
			if err := a.run(cs); !errors.Is(err, boom) || err.Error() != "start agent: boom" {
				t.Fatalf("run: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("stopped %v, want %v", got, tc.want)
			}
		})
	}
}
