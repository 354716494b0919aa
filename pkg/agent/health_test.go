package agent_test

import (
	"testing"

	"github.com/membrane-cni/membrane/pkg/agent/health"
)

// TestHealthDisabledWithFake: the fake datapath runs no health endpoint,
// and the status says so even when it was asked for.
func TestHealthDisabledWithFake(t *testing.T) {
	env := newRestoreEnv(t)
	env.cfg.EnableHealth = true
	_, c := env.start(t, nil)
	st, err := c.Status(ctx10(t))
	if err != nil {
		t.Fatal(err)
	}
	if st.Health == nil || st.Health.State != health.StateDisabled {
		t.Fatalf("health %+v, want disabled", st.Health)
	}
}
