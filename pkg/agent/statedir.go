package agent

import (
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent/metrics"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/restore"
)

// watchStateDir reports the state directory's health: in GET
// /v1/status, as a state-dir-health event and in the state_dir metrics
// at each change, and in the log.
func (a *Agent) watchStateDir() {
	m := a.cfg.API.Metrics
	prev := a.store.Health()
	a.Server.SetStateDir(func() *models.StateDirStatus {
		h := a.store.Health()
		return &models.StateDirStatus{Path: a.cfg.StateDir, Healthy: h.OK, Cause: h.Cause, LastError: h.Err, Since: h.Since}
	})
	prevState := stateDirState(prev)
	if !prev.OK { // read-only at start (a degraded store)
		m.StateDirHealth(false, prev.Cause)
		a.events.Publish(events.Event{Type: events.StateDirHealth, State: prevState, PrevState: "ok", Message: prev.Err})
	}
	// The store calls fn once per change, one at a time.
	a.store.OnHealth(func(h restore.Health) {
		state := stateDirState(h)
		m.StateDirHealth(h.OK, h.Cause)
		if h.OK {
			a.log.Info("state directory healthy again", "state-dir", a.cfg.StateDir, "was", prevState)
		} else {
			a.log.Error("state directory unhealthy: new endpoints and state changes are refused until it works again",
				"state-dir", a.cfg.StateDir, "cause", h.Cause, "err", h.Err)
		}
		a.events.Publish(events.Event{Type: events.StateDirHealth, State: state, PrevState: prevState, Message: h.Err})
		prevState = state
	})
}

// stateDirState is "ok" or the cause of an unhealthy directory.
func stateDirState(h restore.Health) string {
	if h.OK {
		return "ok"
	}
	return h.Cause
}

// onPinRepair reports a check that found BPF pins removed under the
// agent: a bpf-pins-repaired event and the pin metrics.
func onPinRepair(hub *events.Hub, m *metrics.Metrics) func(datapath.PinRepair) {
	return func(rep datapath.PinRepair) {
		state := "repaired"
		if rep.Err != nil {
			state = "failed"
		}
		m.PinRepair(rep.Err == nil, rep.Repinned)
		hub.Publish(events.Event{Type: events.BPFPinsRepaired, State: state, Message: rep.Summary()})
	}
}
