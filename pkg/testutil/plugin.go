package testutil

import (
	"bytes"
	"os"
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
	if err := BuildBinaries(dir, "membrane-cni"); err != nil {
		os.RemoveAll(dir)
		return "", err
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
