package datapath_test

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/membrane-cni/membrane/pkg/clients/cni"
)

// TestAddPhaseRecord: with PhasesEnv set, an ADD and a DEL each append
// a record of their phases, the ADD's with the agent's steps from its
// Server-Timing answer (what make bench-cni prints for the slowest calls).
func TestAddPhaseRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "phases.jsonl")
	t.Setenv(cni.PhasesEnv, path) // libcni passes the environment on
	e := newEnv(t, "10.244.14.0/24")
	startAgent(e, nil)
	p := e.NewPod("phases")
	e.MustAdd(p)
	if err := e.Del(p); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs := map[string]cni.PhaseRecord{}
	for sc := bufio.NewScanner(f); sc.Scan(); {
		var r cni.PhaseRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("record %q: %v", sc.Text(), err)
		}
		if r.ContainerID == p.RT.ContainerID {
			recs[r.Command] = r
		}
	}
	add, del := recs["ADD"], recs["DEL"]
	if add.Failed || len(add.Phases) == 0 || add.End < add.Start || del.Command != "DEL" || len(del.Agent) != 0 {
		t.Fatalf("records: ADD %+v, DEL %+v", add, del)
	}
	var names []string
	for _, ph := range add.Agent {
		if ph.Us < 0 {
			t.Errorf("agent step %+v", ph)
		}
		names = append(names, ph.Name)
	}
	if want := []string{"netns", "veth", "ipam-wait", "configure", "endpoint-wait", "total"}; !slices.Equal(names, want) {
		t.Fatalf("the ADD's agent steps = %v, want %v", names, want)
	}
}
