//go:build !linux

package datapath

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
)

// Linux is unavailable on this platform.
type Linux struct{ Fake }

// NewLinux returns ErrNotSupported on platforms other than Linux.
func NewLinux(cfg LinuxConfig, log *slog.Logger) (*Linux, error) {
	return nil, fmt.Errorf("linux datapath: %w", ErrNotSupported)
}

// SetHooks does nothing on platforms other than Linux.
func (l *Linux) SetHooks(LinuxHooks) {}

// WatchHostAddrs returns ErrNotSupported on platforms other than Linux.
func (l *Linux) WatchHostAddrs(context.Context, func(HostAddrChange)) error {
	return fmt.Errorf("watch host addresses: %w", ErrNotSupported)
}

// NodeAddrs returns ErrNotSupported on platforms other than Linux.
func (l *Linux) NodeAddrs([]netip.Addr) ([]netip.Addr, error) {
	return nil, fmt.Errorf("node addresses: %w", ErrNotSupported)
}

// MountBPFFS returns ErrNotSupported on platforms other than Linux.
func MountBPFFS() error { return fmt.Errorf("mount bpffs: %w", ErrNotSupported) }

// Cleanup returns ErrNotSupported on platforms other than Linux.
func Cleanup(context.Context, CleanupConfig, *slog.Logger) (CleanupReport, error) {
	return CleanupReport{}, fmt.Errorf("cleanup: %w", ErrNotSupported)
}

// MapFull returns nothing on platforms other than Linux.
func (l *Linux) MapFull() map[string]uint64 { return nil }

// MapUsage returns ErrNotSupported on platforms other than Linux.
func (l *Linux) MapUsage() (map[string]MapUsage, error) {
	return nil, fmt.Errorf("map usage: %w", ErrNotSupported)
}
