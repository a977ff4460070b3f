package helm

import (
	"os"
	"testing"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

// TestMain gives the package the shared broker (PULSAR_SERVICE_URL) or one of its own.
func TestMain(m *testing.M) { os.Exit(harness.Run(m, harness.Options{})) }
