package podnet

import (
	"os"

	"golang.org/x/sys/unix"
)

func writeEmpty(path string) error { return os.WriteFile(path, nil, 0o600) }

func mkfifo(path string) error { return unix.Mkfifo(path, 0o600) }
