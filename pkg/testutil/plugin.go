package testutil

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

// BuildPlugin builds membrane-cni into a new temporary directory, static
// as `make build` builds it, for a package's TestMain; the caller removes
// the directory. It runs the go tool, so call it once per package.
func BuildPlugin() (dir string, err error) {
	dir, err = os.MkdirTemp("", "membrane-cni-bin-")
	if err != nil {
		return "", err
	}
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, "membrane-cni"),
		"github.com/membrane-cni/membrane/cmd/membrane-cni")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("build membrane-cni: %w\n%s", err, out)
	}
	return dir, nil
}

// LogBuffer collects a log (an agent's, say) from any goroutine, to print
// when a test fails.
type LogBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
