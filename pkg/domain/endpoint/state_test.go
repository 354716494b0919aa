package endpoint

import (
	"errors"
	"testing"
)

// allStates is every State including StateNone, the "from" of an endpoint
// that has none yet.
var allStates = append([]State{StateNone}, States...)

// ciliumTransitions is the expected table, written out independently of
// state.go: Cilium's Endpoint.SetStateLocked plus the builder-only edges of
// BuilderSetStateLocked (waiting-to-regenerate/restoring -> regenerating,
// regenerating -> ready).
var ciliumTransitions = map[State][]State{
	StateNone:                {StateWaitingForIdentity, StateRestoring},
	StateWaitingForIdentity:  {StateReady, StateDisconnecting},
	StateReady:               {StateWaitingForIdentity, StateDisconnecting, StateWaitingToRegenerate, StateRestoring},
	StateDisconnecting:       {StateDisconnected},
	StateDisconnected:        {},
	StateWaitingToRegenerate: {StateWaitingForIdentity, StateDisconnecting, StateRestoring, StateRegenerating},
	StateRegenerating:        {StateWaitingForIdentity, StateDisconnecting, StateWaitingToRegenerate, StateRestoring, StateReady},
	StateRestoring:           {StateDisconnecting, StateRestoring, StateRegenerating},
}

func TestStatesList(t *testing.T) {
	if got := len(allStates); got != 8 {
		t.Fatalf("len(allStates) = %d, want 8", got)
	}
	seen := map[State]bool{}
	for _, s := range States {
		if s == StateNone {
			t.Errorf("States contains StateNone")
		}
		if seen[s] {
			t.Errorf("States lists %q twice", s)
		}
		seen[s] = true
	}
}

func TestTransitions(t *testing.T) {
	for _, from := range allStates {
		allowed := map[State]bool{}
		for _, to := range ciliumTransitions[from] {
			allowed[to] = true
		}
		for _, to := range allStates {
			name := string(from) + "->" + string(to)
			if from == StateNone {
				name = "none->" + string(to)
			}
			if to == StateNone {
				name += "none"
			}
			t.Run(name, func(t *testing.T) {
				want := allowed[to]
				if got := CanTransition(from, to); got != want {
					t.Errorf("CanTransition(%q, %q) = %v, want %v", from, to, got, want)
				}
				err := Transition(from, to)
				switch {
				case want && err != nil:
					t.Errorf("Transition(%q, %q) = %v, want nil", from, to, err)
				case !want && !errors.Is(err, ErrIllegalTransition):
					t.Errorf("Transition(%q, %q) = %v, want ErrIllegalTransition", from, to, err)
				}
			})
		}
	}
}

func TestStateValid(t *testing.T) {
	for _, s := range States {
		if !s.Valid() {
			t.Errorf("%q.Valid() = false", s)
		}
	}
	for _, s := range []State{StateNone, "bogus", "Ready", "ready "} {
		if s.Valid() {
			t.Errorf("%q.Valid() = true", s)
		}
	}
}

func TestParseState(t *testing.T) {
	tests := []struct {
		in      string
		want    State
		wantErr bool
	}{
		{"waiting-for-identity", StateWaitingForIdentity, false},
		{"waiting-to-regenerate", StateWaitingToRegenerate, false},
		{"regenerating", StateRegenerating, false},
		{"ready", StateReady, false},
		{"disconnecting", StateDisconnecting, false},
		{"disconnected", StateDisconnected, false},
		{"restoring", StateRestoring, false},
		{"", StateNone, true},
		{"READY", StateNone, true},
		{" ready", StateNone, true},
		{"ready\x00", StateNone, true},
		{"unknown", StateNone, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseState(tt.in)
			if tt.wantErr {
				if !errors.Is(err, ErrUnknownState) {
					t.Fatalf("ParseState(%q) error = %v, want ErrUnknownState", tt.in, err)
				}
				if got != StateNone {
					t.Errorf("ParseState(%q) = %q on error, want StateNone", tt.in, got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseState(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		})
	}
}
