package crash

import (
	"os"
	"testing"

	"github.com/membrane-cni/membrane/test/nodeharness"
)

func TestMain(m *testing.M) { os.Exit(nodeharness.Main(m, "membrane-agent", "membranectl")) }
