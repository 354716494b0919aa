package multinode

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// binDir holds membrane-agent and membrane-cni, built once by TestMain.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "membrane-multinode-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, cmd := range []string{"membrane-agent", "membrane-cni"} {
		build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, cmd), "github.com/membrane-cni/membrane/cmd/"+cmd)
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", cmd, err, out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
