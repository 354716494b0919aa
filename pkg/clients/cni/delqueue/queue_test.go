package delqueue

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteReadRemove(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "q")
	e := &Entry{ContainerID: "abc", IfName: "eth0", Namespace: "default", Pod: "web", HostInterface: "lxc123", IPs: []string{"10.0.0.2"}}
	path, err := Write(dir, e)
	if err != nil {
		t.Fatal(err)
	}
	// Writing the same attachment again replaces the entry.
	if _, err := Write(dir, e); err != nil {
		t.Fatal(err)
	}
	names, err := List(dir)
	if err != nil || len(names) != 1 || names[0] != path {
		t.Fatalf("List = %v, %v; want [%s]", names, err, path)
	}
	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Owner() != "default/web" || got.HostInterface != "lxc123" || len(got.IPs) != 1 {
		t.Fatalf("Read = %+v", got)
	}
	if err := Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := Remove(path); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
}

func TestFull(t *testing.T) {
	dir := t.TempDir()
	for i := range MaxEntries {
		if _, err := Write(dir, &Entry{ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Write(dir, &Entry{ContainerID: "one-more", IfName: "eth0"}); !errors.Is(err, ErrFull) {
		t.Fatalf("Write beyond MaxEntries = %v, want ErrFull", err)
	}
	// Rewriting a queued attachment does not grow the queue.
	if _, err := Write(dir, &Entry{ContainerID: "c0", IfName: "eth0"}); err != nil {
		t.Fatalf("rewrite of a queued entry = %v", err)
	}
	// Temporary files do not count and are not listed.
	if err := os.WriteFile(filepath.Join(dir, ".tmp-x.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	names, _ := List(dir)
	if len(names) != MaxEntries {
		t.Fatalf("List = %d entries, want %d", len(names), MaxEntries)
	}
}

// TestFileNames: attachments whose IDs join to the same string keep
// separate entries, and a container ID of 255 bytes still fits a file
// name.
func TestFileNames(t *testing.T) {
	dir := t.TempDir()
	entries := []*Entry{
		{ContainerID: "a_b", IfName: "c", IPs: []string{"10.0.0.1"}},
		{ContainerID: "a", IfName: "b_c", IPs: []string{"10.0.0.2"}},
		{ContainerID: strings.Repeat("f", 255), IfName: "net1", IPs: []string{"10.0.0.3"}},
	}
	for _, e := range entries {
		if _, err := Write(dir, e); err != nil {
			t.Fatalf("Write %s/%s: %v", e.ContainerID, e.IfName, err)
		}
	}
	names, err := List(dir)
	if err != nil || len(names) != len(entries) {
		t.Fatalf("List = %v, %v; want %d entries", names, err, len(entries))
	}
	got := map[string]string{}
	for _, n := range names {
		e, err := Read(n)
		if err != nil {
			t.Fatal(err)
		}
		got[e.ContainerID+"/"+e.IfName] = e.IPs[0]
	}
	for _, e := range entries {
		if got[e.ContainerID+"/"+e.IfName] != e.IPs[0] {
			t.Errorf("entry %s/%s lost: read back %v", e.ContainerID, e.IfName, got)
		}
	}
}

func TestInvalid(t *testing.T) {
	for name, e := range map[string]*Entry{
		"no container":         {IfName: "eth0"},
		"slash":                {ContainerID: "a/b", IfName: "eth0"},
		"dot":                  {ContainerID: "..", IfName: "eth0"},
		"no ifname":            {ContainerID: "a"},
		"ifname dotdot":        {ContainerID: "a", IfName: ".."},
		"ifname too long":      {ContainerID: "a", IfName: "eth0123456789abc"},
		"ifname all":           {ContainerID: "a", IfName: "all"},
		"host interface eth0":  {ContainerID: "a", IfName: "eth0", HostInterface: "eth0"},
		"host interface long":  {ContainerID: "a", IfName: "eth0", HostInterface: "lxc0123456789abcd"},
		"host interface other": {ContainerID: "a", IfName: "eth0", HostInterface: "membrane_host"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Write(t.TempDir(), e); !errors.Is(err, ErrInvalidEntry) {
				t.Fatalf("Write = %v, want ErrInvalidEntry", err)
			}
		})
	}
	if _, err := Decode([]byte(`{"version":2,"containerID":"a","ifname":"eth0"}`)); !errors.Is(err, ErrInvalidEntry) {
		t.Fatalf("Decode of version 2 = %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"version":1,"containerID":"a","ifname":"eth0","ips":["10.0.0.1"]}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := Decode(data)
		if err != nil {
			return
		}
		if filepath.Base(e.FileName()) != e.FileName() {
			t.Fatalf("entry %+v escapes the queue directory: %q", e, e.FileName())
		}
	})
}

// TestFileNameStable pins an entry's file name to the SHA-256 of
// container ID, NUL, interface name: entries queued by an older plugin
// must still be found (a repeated DEL overwrites its earlier entry).
func TestFileNameStable(t *testing.T) {
	for _, e := range []*Entry{{ContainerID: "abc", IfName: "eth0"}, {ContainerID: strings.Repeat("0123456789", 30), IfName: "net1"}} {
		sum := sha256.Sum256([]byte(e.ContainerID + "\x00" + e.IfName))
		if want := hex.EncodeToString(sum[:]) + ".json"; e.FileName() != want {
			t.Errorf("FileName(%s/%s) = %q, want %q", e.ContainerID, e.IfName, e.FileName(), want)
		}
	}
}
