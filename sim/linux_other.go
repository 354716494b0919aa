//go:build !linux

package sim

import (
	"fmt"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent"
)

// checkLinuxHost refuses the linux datapath off Linux.
func checkLinuxHost() error {
	return fmt.Errorf("datapath (--datapath): linux runs only on Linux: %w", ErrLinuxUnavailable)
}

// AbortCleanup does nothing off Linux: nothing is created in a kernel.
func AbortCleanup() {}

// LocateCNI is not needed off Linux.
func LocateCNI(string) (string, error) {
	return "", fmt.Errorf("locate membrane-cni: %w", ErrLinuxUnavailable)
}

func (e *engine) setupLinux(agent.Config) (func(), error) {
	return nil, fmt.Errorf("linux datapath: %w", ErrLinuxUnavailable)
}

// tmpfsBase has no tmpfs to offer off Linux: runs use the temp dir.
func tmpfsBase() string { return "" }

// fsType names the filesystem of dir ("" when unknown).
func fsType(string) string { return "" }

// processCPU is not measured off Linux.
func processCPU() time.Duration { return 0 }
