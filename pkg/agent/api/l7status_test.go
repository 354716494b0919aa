package api

import (
	"testing"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/datapath/l7proxy"
)

type l7Datapath struct {
	*datapath.Fake
	st *datapath.L7Status
}

func (d l7Datapath) L7Status() *datapath.L7Status { return d.st }

func TestL7Status(t *testing.T) {
	if got := l7Status(datapath.NewFake(1)); got != nil {
		t.Errorf("fake datapath: %+v, want none", got)
	}
	if got := l7Status(l7Datapath{datapath.NewFake(1), nil}); got != nil {
		t.Errorf("L7 off: %+v, want none", got)
	}
	st := &datapath.L7Status{Process: l7proxy.SupervisorStatus{PID: 42, Restarts: 1, LastExit: "killed"}, Version: 9,
		Acks: l7proxy.TrackerStatus{Acked: 8, Pending: 1, Nacks: 2, LastNack: "bad"}}
	got := l7Status(l7Datapath{datapath.NewFake(1), st})
	if got == nil || got.PID != 42 || got.Restarts != 1 || got.LastExit != "killed" || got.Version != 9 ||
		got.Acked != 8 || got.Pending != 1 || got.Nacks != 2 || got.LastNack != "bad" {
		t.Errorf("l7Status = %+v", got)
	}
}
