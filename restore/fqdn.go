package restore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// FQDNFile is the name, in the state directory, of the names learned
// from DNS answers (fqdn.File: the policy actor's cache with each
// address's expiry), so that an agent restart keeps the toFQDNs
// addresses its pods resolved.
const FQDNFile = "fqdn.json"

// WriteFQDN replaces <dir>/FQDNFile with data atomically and durably, as
// the rest of the state directory is written: a temporary file, fsync,
// rename over the old one, fsync of the directory. A crash leaves the
// old file or the new one, never a torn one. It blocks: call it from
// the worker pool.
func WriteFQDN(dir string, data []byte) (retErr error) {
	tmp := filepath.Join(dir, FQDNFile+tmpSuffix)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("write fqdn cache: %w", err)
	}
	defer func() {
		if retErr != nil {
			_ = os.Remove(tmp)
		}
	}()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, FQDNFile))
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("write fqdn cache: %w", err)
	}
	return nil
}

// ReadFQDN returns the contents of <dir>/FQDNFile (nil, nil when there is
// none).
func ReadFQDN(dir string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(dir, FQDNFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read fqdn cache: %w", err)
	}
	return b, nil
}
