package host

import (
	"fmt"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if n := offMachineDials.Load(); n > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: agenthost_http tried to dial %d addresses off loopback; the test guard refused them, but the gate should have\n", n)
		code = 1
	}
	os.Exit(code)
}
