package restore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// Quarantine queues moving an endpoint's state to <dir>/quarantine/, for
// state that reads fine but was refused (a restore conflict): the next
// Scan no longer finds it, and an operator still can. done is called once
// the move is durable, with whether state was there to move.
func (s *Store) Quarantine(id endpoint.ID, done func(moved bool, err error)) {
	moved := new(bool)
	s.submit(request{id: id, quarantine: true, moved: moved, done: func(err error) { done(*moved, err) }})
}

// writeQuarantine writes data as a file named name in the quarantine and
// returns its path.
func (s *Store) writeQuarantine(name string, data []byte) (string, error) {
	qdir := filepath.Join(s.dir, quarantineDir)
	if err := os.MkdirAll(qdir, 0o750); err != nil {
		return "", err
	}
	p := filepath.Join(qdir, name)
	return p, os.WriteFile(p, data, 0o640)
}

// quarantineState moves <id> into the quarantine with one rename, then
// removes the spare as a removal would. Missing state is success.
func (s *Store) quarantineState(id endpoint.ID, res *result) error {
	var sb pathBuf
	src := s.sd.abs(entryPath(sb[:0], id, ""))
	qdir := filepath.Join(s.dir, quarantineDir)
	if err := os.MkdirAll(qdir, 0o750); err != nil {
		return fmt.Errorf("quarantine state of endpoint %d: %w", id, err)
	}
	dst := filepath.Join(qdir, fmt.Sprintf("%d-%d", id, time.Now().UnixNano()))
	switch err := os.Rename(src, dst); {
	case err == nil:
		res.quarantined = true
	case errors.Is(err, unix.ENOENT):
	default:
		return fmt.Errorf("quarantine state of endpoint %d: %w", id, err)
	}
	return s.remove(id, res)
}
