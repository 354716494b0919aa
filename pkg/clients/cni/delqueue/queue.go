// Package delqueue is the on-disk queue of CNI DEL requests that
// membrane-cni could not deliver because the agent was unreachable. The
// plugin writes one file per attachment (write to a temporary name, then
// rename, so a reader never sees a partial file); the agent drains the
// directory when it starts and periodically afterwards. The format is
// shared by both sides and versioned.
package delqueue

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/namehash"

	"github.com/membrane-cni/membrane/pkg/domain/ifname"
)

var (
	// ErrFull is returned by Write when the queue already holds MaxEntries
	// files; the plugin answers CNI error 11 (try again later).
	ErrFull = errors.New("delete queue full")
	// ErrInvalidEntry is returned by Read and Write for an entry that
	// fails validation (missing container ID, unknown version, bad names).
	ErrInvalidEntry = errors.New("invalid delete queue entry")
)

const (
	// MaxEntries bounds the queue: a write that would make it hold more
	// than this many files is refused with ErrFull.
	MaxEntries = 256
	// Version is the current entry format.
	Version = 1
	// suffix names complete entries; temporary files start with tmpPrefix.
	suffix    = ".json"
	tmpPrefix = ".tmp-"
	// maxEntrySize bounds what Read accepts (entries are a few hundred bytes).
	maxEntrySize = 64 << 10
)

// Entry is one queued deletion: the CNI DEL's attachment and what the
// plugin knew about it.
type Entry struct {
	Version     int    `json:"version"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
	Netns       string `json:"netns,omitempty"`
	// Namespace and Pod come from CNI_ARGS (K8S_POD_NAMESPACE, K8S_POD_NAME).
	Namespace string `json:"namespace,omitempty"`
	Pod       string `json:"pod,omitempty"`
	// HostInterface is the host side of the veth (lxc<hash>); the agent
	// deletes it only if it has the plugin's pattern and is a veth.
	HostInterface string `json:"hostInterface"`
	// IPs are the pod's addresses from the DEL's prevResult, if any.
	IPs []string `json:"ips,omitempty"`
	// Queued is when the plugin wrote the entry.
	Queued time.Time `json:"queued"`
}

// Owner is the IPAM owner string membrane-cni allocated the entry's
// addresses with: "<namespace>/<pod>", or "" outside Kubernetes.
func (e *Entry) Owner() string {
	if e.Namespace == "" && e.Pod == "" {
		return ""
	}
	return e.Namespace + "/" + e.Pod
}

// Validate returns an error wrapping ErrInvalidEntry naming the bad field.
func (e *Entry) Validate() error {
	switch {
	case e.Version != Version:
		return fmt.Errorf("field \"version\": %d, want %d: %w", e.Version, Version, ErrInvalidEntry)
	case !safeName(e.ContainerID):
		return fmt.Errorf("field \"containerID\": %q: %w", e.ContainerID, ErrInvalidEntry)
	case !ifname.Valid(e.IfName):
		return fmt.Errorf("field \"ifname\": %q: %w", e.IfName, ErrInvalidEntry)
	case e.HostInterface != "" && !ifname.ValidHost(e.HostInterface):
		return fmt.Errorf("field \"hostInterface\": %q: not a host interface membrane-cni creates: %w", e.HostInterface, ErrInvalidEntry)
	}
	return nil
}

// safeName accepts names usable in a file name: non-empty, at most 255
// bytes, no '/', no leading '.', no control characters or spaces.
func safeName(s string) bool {
	if s == "" || len(s) > 255 || s[0] == '.' {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f || r == '/' {
			return false
		}
	}
	return true
}

// FileName is the entry's file name: one file per attachment, so a DEL
// the runtime repeats overwrites its earlier entry instead of adding one.
// It is the SHA-256 of the attachment (container ID, NUL, interface name;
// neither may hold a NUL), so distinct attachments get distinct names
// and every name is 69 bytes whatever the container ID's length. The
// attachment itself is inside the file.
func (e *Entry) FileName() string {
	digest := namehash.Sum256([]byte(e.ContainerID), []byte{0}, []byte(e.IfName))
	return hex.EncodeToString(digest[:]) + suffix
}

// Write stores e in dir (created if missing) atomically. Returns ErrFull
// if the queue holds MaxEntries other files already.
func Write(dir string, e *Entry) (string, error) {
	if e.Version == 0 {
		e.Version = Version
	}
	if err := e.Validate(); err != nil {
		return "", fmt.Errorf("queue deletion: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("queue deletion: %w", err)
	}
	names, err := List(dir)
	if err != nil {
		return "", fmt.Errorf("queue deletion: %w", err)
	}
	final := filepath.Join(dir, e.FileName())
	if len(names) >= MaxEntries && !contains(names, final) {
		return "", fmt.Errorf("queue deletion: %d entries in %s: %w", len(names), dir, ErrFull)
	}
	data, err := json.Marshal(e)
	if err != nil {
		return "", fmt.Errorf("queue deletion: encode: %w", err)
	}
	tmp := filepath.Join(dir, tmpPrefix+e.FileName()+"."+strconv.Itoa(os.Getpid()))
	if err := writeSync(tmp, data); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("queue deletion: %w", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("queue deletion: %w", err)
	}
	return final, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func writeSync(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// List returns the paths of the complete entries in dir, oldest name
// order; a missing directory is an empty queue.
func List(dir string) ([]string, error) {
	des, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list delete queue: %w", err)
	}
	var out []string
	for _, de := range des {
		n := de.Name()
		if de.Type().IsRegular() && strings.HasSuffix(n, suffix) && !strings.HasPrefix(n, ".") {
			out = append(out, filepath.Join(dir, n))
		}
	}
	return out, nil
}

// Read decodes and validates one entry file.
func Read(path string) (*Entry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read delete queue entry: %w", err)
	}
	return Decode(data)
}

// Decode parses and validates an entry.
func Decode(data []byte) (*Entry, error) {
	if len(data) > maxEntrySize {
		return nil, fmt.Errorf("decode delete queue entry: %d bytes: %w", len(data), ErrInvalidEntry)
	}
	var e Entry
	if err := json.Unmarshal(data, &e); err != nil {
		return nil, fmt.Errorf("decode delete queue entry: %v: %w", err, ErrInvalidEntry)
	}
	if err := e.Validate(); err != nil {
		return nil, fmt.Errorf("decode delete queue entry: %w", err)
	}
	return &e, nil
}

// Remove deletes an entry; a missing one is success.
func Remove(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove delete queue entry: %w", err)
	}
	return nil
}
