//go:build !linux

package procmem

import "errors"

// ReleaseExecutable is Linux only.
func ReleaseExecutable() (Release, error) {
	return Release{}, errors.New("release executable pages: not supported on this platform")
}
