package sim

import "fmt"

// maxLinuxEndpoints bounds --endpoints with the linux datapath unless
// forced (--force): each pod is a network namespace, a veth pair and BPF
// programs, made by a plugin process.
const maxLinuxEndpoints = 500

// cniNetwork is the CNI network name of the harness's conflist.
const cniNetwork = "membrane-sim"

// validateLinux checks a linux scenario and the host it runs on
// (checkLinuxHost: linux_linux.go, linux_other.go).
func (s *Scenario) validateLinux() error {
	if s.Endpoints > maxLinuxEndpoints && !s.ForceLinux {
		return fmt.Errorf("endpoints (--endpoints): %d with the linux datapath: at most %d (each pod is a network namespace, "+
			"a veth pair and BPF programs); pass --force (force_linux) to run more: %w", s.Endpoints, maxLinuxEndpoints, ErrInvalidScenario)
	}
	return checkLinuxHost()
}
