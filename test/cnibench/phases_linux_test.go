package cnibench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/cni"
)

// sumCount is a histogram's sum (seconds) and count.
type sumCount struct {
	sum   float64
	count uint64
}

// phaseSums are one agent's phase histograms by key: "api <method>
// <route>", "regen <phase>" and "dp <phase>".
type phaseSums map[string]sumCount

// agentPhases reads every Membrane arm's phase histograms, by arm.
func agentPhases(arms []*arm) map[string]phaseSums {
	out := map[string]phaseSums{}
	for _, a := range arms {
		if a.agent == nil {
			continue
		}
		out[a.name] = readPhases(a)
	}
	return out
}

func readPhases(a *arm) phaseSums {
	ps := phaseSums{}
	mfs, err := a.agent.metrics()
	if err != nil {
		return ps
	}
	for _, mf := range mfs {
		var prefix string
		switch mf.GetName() {
		case "membrane_api_request_duration_seconds":
			prefix = "api"
		case "membrane_endpoint_regeneration_duration_seconds":
			prefix = "regen"
		case "membrane_datapath_phase_duration_seconds":
			prefix = "dp"
		default:
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			key := prefix + " " + labels["phase"]
			if prefix == "api" {
				key = "api " + labels["route"]
			}
			h := m.GetHistogram()
			sc := ps[key]
			sc.sum += h.GetSampleSum()
			sc.count += h.GetSampleCount()
			ps[key] = sc
		}
	}
	return ps
}

// mean is the mean of key between two snapshots, per n calls (0: per
// observation).
func mean(before, after phaseSums, key string, n int) (time.Duration, uint64) {
	d := after[key].sum - before[key].sum
	c := after[key].count - before[key].count
	if n == 0 {
		if c == 0 {
			return 0, 0
		}
		n = int(c)
	}
	return time.Duration(d / float64(n) * float64(time.Second)), c
}

// pluginPhases reads the plugin's phase records by command and container ID.
func pluginPhases(t *testing.T, path string) map[string]cni.PhaseRecord {
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("plugin phases: %v", err)
	}
	defer f.Close()
	out := map[string]cni.PhaseRecord{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var r cni.PhaseRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("plugin phases: %v", err)
		}
		out[r.Command+" "+r.ContainerID] = r
	}
	return out
}

// phaseTable accumulates named durations in first-seen order.
type phaseTable struct {
	names []string
	all   map[string][]time.Duration
}

func newPhaseTable() *phaseTable {
	return &phaseTable{all: map[string][]time.Duration{}}
}

func (p *phaseTable) add(name string, d time.Duration) {
	if _, ok := p.all[name]; !ok {
		p.names = append(p.names, name)
	}
	p.all[name] = append(p.all[name], d)
}

// row is name's mean and median.
func (p *phaseTable) row(name string) string {
	ds := p.all[name]
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return fmt.Sprintf("| %s | %s | %s |", name, ms(sum/time.Duration(len(ds))), ms(summarize(ds).p50))
}

// breakdown prints, per Membrane arm, where the mean sequential ADD's and
// DEL's time went: the caller's and the plugin's phases (the plugin's
// MEMBRANE_CNI_PHASES records, matched to the calls by container ID) and,
// inside the plugin's agent calls, the agent's (its API, regeneration and
// datapath histograms, read before the ADDs, between ADDs and DELs and
// after the DELs).
func breakdown(t *testing.T, arms []*arm, cs calls, path string, snaps [3]map[string]phaseSums) string {
	recs := pluginPhases(t, path)
	var b strings.Builder
	for _, a := range arms {
		if a.agent == nil {
			continue
		}
		for k, cmd := range []string{"ADD", "DEL"} {
			byID := cs.add
			if cmd == "DEL" {
				byID = cs.del
			}
			pt := newPhaseTable()
			n, threads := 0, 0
			var faults int64
			var slow []slowCall
			for id, c := range byID {
				if c.arm != a.name {
					continue
				}
				r, ok := recs[cmd+" "+id]
				if !ok {
					t.Errorf("%s %s %s: no plugin phase record", a.name, cmd, id)
					continue
				}
				n++
				pt.add("libcni, fork+exec, Go runtime start", time.Unix(0, r.Start).Sub(c.start))
				for _, p := range r.Phases {
					pt.add("plugin: "+p.Name, time.Duration(p.Us)*time.Microsecond)
				}
				if ret, ok := a.exec.returnedAt(cmd, id); ok {
					pt.add("plugin exit (until libcni's exec returns)", ret.Sub(time.Unix(0, r.End)))
					pt.add("libcni after the plugin (result, cache file)", c.end.Sub(ret))
				} else {
					pt.add("plugin exit, libcni", c.end.Sub(time.Unix(0, r.End)))
				}
				pt.add("= whole call", c.end.Sub(c.start))
				slow = append(slow, slowCall{c, r})
				threads += r.Threads
				faults += r.MinorFaults
			}
			if n == 0 {
				continue
			}
			fmt.Fprintf(&b, "\n%s %s, mean and median of %d sequential calls:\n\n| phase | mean | median |\n|---|---|---|\n", a.name, cmd, n)
			for _, name := range pt.names {
				fmt.Fprintln(&b, pt.row(name))
			}
			fmt.Fprintf(&b, "\nplugin at its end, on average (each thread runs once more to exit, and the exit frees the memory): %.1f OS threads, %d minor page faults\n",
				float64(threads)/float64(n), faults/int64(n))
			printSlowest(&b, slow, 3)
			before, after := snaps[k][a.name], snaps[k+1][a.name]
			agentRows(&b, cmd, before, after, n)
		}
	}
	return b.String()
}

// slowCall is one sequential call with its plugin phase record.
type slowCall struct {
	c call
	r cni.PhaseRecord
}

// printSlowest prints the k slowest calls (they make the p99): when each
// started and its phases of 1 ms or more, the agent's steps among them
// (in parentheses, part of the attach), so that a tail shows where it
// comes from.
func printSlowest(b *strings.Builder, calls []slowCall, k int) {
	if len(calls) == 0 {
		return
	}
	first := calls[0].c.start
	for _, s := range calls {
		if s.c.start.Before(first) {
			first = s.c.start
		}
	}
	sort.Slice(calls, func(i, j int) bool {
		return calls[i].c.end.Sub(calls[i].c.start) > calls[j].c.end.Sub(calls[j].c.start)
	})
	fmt.Fprintf(b, "slowest calls (phases of 1 ms or more):\n")
	for _, s := range calls[:min(k, len(calls))] {
		var long []string
		if d := time.Unix(0, s.r.Start).Sub(s.c.start); d >= time.Millisecond {
			long = append(long, "start "+ms(d))
		}
		phases := func(ps []cni.Phase, format string) {
			for _, p := range ps {
				if d := time.Duration(p.Us) * time.Microsecond; d >= time.Millisecond {
					long = append(long, fmt.Sprintf(format, p.Name, ms(d)))
				}
			}
		}
		phases(s.r.Phases, "%s %s")
		phases(s.r.Agent, "(agent %s %s)") // the agent's steps of the attach (Server-Timing)
		if d := s.c.end.Sub(time.Unix(0, s.r.End)); d >= time.Millisecond {
			long = append(long, "exit and libcni "+ms(d))
		}
		fmt.Fprintf(b, "  %s at %.1f s: %s\n", ms(s.c.end.Sub(s.c.start)), s.c.start.Sub(first).Seconds(), strings.Join(long, ", "))
	}
}

// agentRows prints the agent's side of n calls of cmd.
func agentRows(b *strings.Builder, cmd string, before, after phaseSums, n int) {
	row := func(what, key string) {
		d, c := mean(before, after, key, n)
		fmt.Fprintf(b, "| %s | %s (%d observations) |\n", what, ms(d), c)
	}
	fmt.Fprintf(b, "\nagent side of those %d calls (from its histograms; means per call):\n\n| phase | mean |\n|---|---|\n", n)
	if cmd == "ADD" {
		row("POST /v1/attach (the ADD in the agent)", "api POST /v1/attach")
		row("- open the pod's netns, netlink handles", "dp attach-netns")
		row("- veth (peer created in the pod's netns; the address allocation alongside)", "dp attach-veth")
		row("- address allocation: what was left after the veth", "dp attach-ipam-wait")
		row("- pod side: up, addresses, routes (the endpoint creation alongside)", "dp attach-configure")
		row("- endpoint creation (sync): what was left after the pod side", "dp attach-endpoint-wait")
		row("the endpoint's regeneration (alongside the pod side)", "regen total")
		row("- compute policy (policy actor round trip)", "regen compute-policy")
		pol, _ := mean(before, after, "regen compute-policy", n)
		ws, _ := mean(before, after, "regen write-state", n)
		fmt.Fprintf(b, "| - state write, durable (group commit, syncfs) | %s |\n", ms(ws-pol))
		row("- bpf-prepare: a filled slot's policy maps pinned, in the pool alongside the state write (programs: once per node)", "dp bpf-prepare")
		row("- realize (datapath, in the worker pool)", "regen realize")
		row("-- the datapath's Realize (realize minus this: pool queue, actor hops)", "dp realize")
		for _, p := range []struct{ name, what string }{{"bpf-claim", " (waiting for the Prepare)"}, {"host-setup", ""}, {"host-sysctls", ""}, {"bpf-maps", ""}, {"bpf-policy", ""},
			{"bpf-load", " (the endpoints map entry by ifindex)"}, {"bpf-attach", ""}} {
			row("-- "+p.name+p.what, "dp "+p.name)
		}
		return
	}
	row("DELETE /v1/endpoint (by attachment)", "api DELETE /v1/endpoint")
	del, _ := mean(before, after, "api DELETE /v1/endpoint", n)
	rm, _ := mean(before, after, "dp remove", n)
	fmt.Fprintf(b, "| - API, actor hops, state removal, durable (DELETE minus datapath) | %s |\n", ms(del-rm))
	row("- datapath remove (on the DEL's path)", "dp remove")
	row("-- remove-bpf (map entries, pins, conntrack)", "dp remove-bpf")
	row("-- remove-tombstone (routes; host veth down, renamed)", "dp remove-tombstone")
}
