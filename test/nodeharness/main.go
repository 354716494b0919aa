package nodeharness

import (
	"path/filepath"
	"testing"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// binDir holds the programs Main built for the test binary ("": none).
var binDir string

// Main is a suite's TestMain body: it builds membrane-cni and programs
// (membrane-agent for Node.Process, membrane-proxy for the L7 proxy)
// once, runs the tests and removes them, returning the exit code.
func Main(m *testing.M, programs ...string) int { return Run(m.Run, programs...) }

// Run is Main for a TestMain that wraps m.Run itself (kubetest.Main):
// it builds the programs, calls run and removes them.
func Run(run func() int, programs ...string) int {
	return testutil.RunBuilt(run, &binDir, append([]string{"membrane-cni"}, programs...)...)
}

// BinDir is the directory of the programs Main built (the CNI_PATH of
// every node's network).
func BinDir() string { return binDir }

// Bin is the path of the program name that Main built.
func Bin(name string) string { return filepath.Join(binDir, name) }
