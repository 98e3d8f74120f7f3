package badgerstore

import (
	"bytes"
	"testing"
)

func TestKeyPrefixesNeverCrossATenantOrASession(t *testing.T) {
	pairs := []struct {
		name        string
		scan, other key
	}{
		{"tenant a vs ab", runKey("a", ""), runKey("ab", "")},
		{"session s vs s1", orderPrefix("t", "s"), orderPrefix("t", "s1")},
		{"a+bs vs ab+s", orderPrefix("a", "bs"), orderPrefix("ab", "s")},
		{"run r vs r1 events", eventPrefix("t", "r"), eventKey("t", "r1", 1)},
		{"executing s vs s1", executingPrefix("t", "s"), executingPrefix("t", "s1").u64(1).str("e")},
		{"kv plugin p vs p1", newKey(tKV).str("t").str("p"), kvKey("t", "p1", []byte("x"))},
		{"status of tenant a vs ab", statusPrefix("a", "pending"), statusPrefix("ab", "pending").raw("r")},
	}
	for _, p := range pairs {
		if bytes.HasPrefix(p.other, p.scan) {
			t.Errorf("%s: a scan of %x reaches %x", p.name, []byte(p.scan), []byte(p.other))
		}
	}
	kr := readKey(terminalKey(42, "tenant", "run"), tTerminal)
	if at, tenant, run := kr.u64(), kr.str(), kr.str(); kr.err != nil || at != 42 || tenant != "tenant" || run != "run" {
		t.Fatalf("terminal key decodes to %d %q %q %v", at, tenant, run, kr.err)
	}
}
