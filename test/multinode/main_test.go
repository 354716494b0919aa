package multinode

import (
	"os"
	"testing"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// binDir holds membrane-agent and membrane-cni, built once by TestMain.
var binDir string

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithBinaries(m, &binDir, "membrane-agent", "membrane-cni"))
}
