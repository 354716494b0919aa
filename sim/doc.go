// Package sim will own membrane-sim, the harness that drives thousands of
// endpoints through the real agent (actors, index, REST API on its unix
// socket) with the fake datapath, fault injection (datapath.FakeHooks),
// crashes and invariant checks. It lands with the simulation issue.
package sim
