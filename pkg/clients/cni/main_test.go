package cni_test

import (
	"os"
	"testing"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// pluginDir holds the membrane-cni binary built once for the package
// (the spec tests exec it as a runtime would; the tests with an agent
// are in test/datapath).
var pluginDir string

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithBinaries(m, &pluginDir, "membrane-cni"))
}
