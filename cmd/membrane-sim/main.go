// Command membrane-sim will drive thousands of endpoints through the real
// agent with faults, crashes and invariant checks (see sim/doc.go). Until
// the simulation issue lands it only prints its usage.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprint(os.Stderr, `usage: membrane-sim [--endpoints N] [--duration D] [--seed S] [--crashes N] [--fault-rate R] [--datapath fake|linux] [--report FILE.json] [--html FILE]

membrane-sim is not implemented yet: it arrives with the simulation harness
issue. Until then, "make demo" and "go test -bench . ./pkg/api/" exercise the
agent (see README.md and BENCHMARKS.md).
`)
	os.Exit(2)
}
