package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// fileFormat is policy.json: the repository revision and every policy
// document as imported.
type fileFormat struct {
	Revision uint64            `json:"revision"`
	Policies []json.RawMessage `json:"policies"`
}

// MarshalFile returns the policy.json content for pols at revision rev.
func MarshalFile(rev uint64, pols []*Policy) ([]byte, error) {
	f := fileFormat{Revision: rev, Policies: make([]json.RawMessage, len(pols))}
	for i, p := range pols {
		f.Policies[i] = p.Raw
	}
	b, err := json.Marshal(&f)
	if err != nil {
		return nil, fmt.Errorf("marshal policy file: %w", err)
	}
	return b, nil
}

// ReadFile reads policy.json; a missing file is no policies at revision 0.
// Returns an error wrapping ErrInvalidPolicy if the file does not parse.
func ReadFile(path string) (uint64, []*Policy, error) { return ReadFileWith(path, ParseOptions{}) }

// ReadFileWith is ReadFile parsing with opts. The file holds only
// documents the agent accepted, some of them partially (Policy.Refused):
// it is always read with PartialRefusal, so that such a document comes
// back as it was in force instead of failing the agent's start.
func ReadFileWith(path string, opts ParseOptions) (uint64, []*Policy, error) {
	opts.PartialRefusal = true
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil, nil
	}
	if err != nil {
		return 0, nil, fmt.Errorf("read policy file: %w", err)
	}
	var f fileFormat
	if err := json.Unmarshal(b, &f); err != nil {
		return 0, nil, fmt.Errorf("read policy file %s: %w: %w", path, ErrInvalidPolicy, err)
	}
	if len(f.Policies) == 0 {
		return f.Revision, nil, nil
	}
	list, _ := json.Marshal(f.Policies)
	pols, err := ParseWith(list, opts)
	if err != nil {
		return 0, nil, fmt.Errorf("read policy file %s: %w", path, err)
	}
	return f.Revision, pols, nil
}

// WriteFile replaces path with data atomically and durably: a temporary
// file in the same directory, fsync, rename, fsync of the directory.
// It blocks: call it from the datapath worker pool.
func WriteFile(path string, data []byte) (retErr error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, ".policy-*.tmp")
	if err != nil {
		return fmt.Errorf("write policy file: %w", err)
	}
	defer func() {
		if retErr != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("write policy file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("write policy file: sync: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write policy file: close: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write policy file: rename: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("write policy file: open dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("write policy file: sync dir: %w", err)
	}
	return nil
}
