package testutil

import (
	"bytes"
	"sync"
)

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
