package host

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/plugins/abi"
)

// The rewrite cache holds what instrumentLoops made of a module, by the
// module's sha256, and serves it back instead of rewriting again; an
// entry whose checksum fails is rewritten and replaced.
func TestRewriteCacheServesAndRepairsItsEntries(t *testing.T) {
	h, err := New(Config{CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(t.Context())
	sum := sha256.Sum256(spinModule)
	want, err := instrumentLoops(spinModule)
	if err != nil {
		t.Fatal(err)
	}
	entry := filepath.Join(rewriteCacheDir(h.cfg.CacheDir), hex.EncodeToString(sum[:]))
	withSum := func(module []byte) []byte {
		return binary.LittleEndian.AppendUint32(append([]byte{}, module...), crc32.Checksum(module, castagnoli))
	}
	rewrite := func(what string) []byte {
		t.Helper()
		got, err := h.instrumentLoopsCached("spin", spinModule, sum)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return got
	}
	stored := func() []byte {
		t.Helper()
		b, err := os.ReadFile(entry)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	if got := rewrite("first rewrite"); !bytes.Equal(got, want) {
		t.Fatal("the first rewrite is not instrumentLoops's")
	}
	if !bytes.Equal(stored(), withSum(want)) {
		t.Fatalf("entry %s is not the rewrite and its checksum", entry)
	}
	// An entry with a good checksum is served as it is: the module is not
	// rewritten again.
	marked := append(append([]byte{}, want...), 0x00)
	if err := os.WriteFile(entry, withSum(marked), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := rewrite("a cached rewrite"); !bytes.Equal(got, marked) {
		t.Fatal("the cached entry was not served: the module was rewritten again")
	}
	// A damaged entry, and a torn one, are rewritten and replaced.
	damaged := withSum(want)
	damaged[len(damaged)/2] ^= 0x01
	for what, b := range map[string][]byte{"damaged": damaged, "torn": damaged[:3]} {
		if err := os.WriteFile(entry, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if got := rewrite(what); !bytes.Equal(got, want) {
			t.Fatalf("a %s entry was served", what)
		}
		if !bytes.Equal(stored(), withSum(want)) {
			t.Fatalf("the %s entry was not replaced", what)
		}
	}
}

// A load on the native path goes through the rewrite cache: the rewrite
// of the file is there afterwards, by the file's sha256. (The entry is
// removed first from the shared cache, which any load fills again.)
func TestLoadKeepsTheRewriteInTheCache(t *testing.T) {
	wasm, err := os.ReadFile(pluginPath(t, conformance.PluginExecutor))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(wasm)
	entry := filepath.Join(rewriteCacheDir(conformance.WazeroCacheDir()), hex.EncodeToString(sum[:]))
	if err := os.Remove(entry); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	newEnv(t, Config{}).load(t, conformance.PluginExecutor, abi.RoleExecutor, nil)
	b, err := os.ReadFile(entry)
	if err != nil {
		t.Fatalf("no rewrite cache entry after a load: %v", err)
	}
	if _, ok := checkedRewrite(b); !ok {
		t.Fatalf("the rewrite cache entry %s fails its checksum", entry)
	}
}

// The sha256 of instrumentLoops(spinModule), and the rewriteCacheVersion
// of that rewrite.
const (
	rewriteOfSpinModule        = "c342e2f4d37f4e4652b76f8c8a5553967f3eebe9304c270aa68ce883e289ff0e"
	rewriteOfSpinModuleVersion = 1
)

// A change of instrumentLoops's output must change rewriteCacheVersion:
// the cache would otherwise serve the rewrites of the old code.
func TestRewriteCacheVersionPinsTheRewrite(t *testing.T) {
	out, err := instrumentLoops(spinModule)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(out)
	if got := hex.EncodeToString(sum[:]); got != rewriteOfSpinModule || rewriteCacheVersion != rewriteOfSpinModuleVersion {
		t.Fatalf("instrumentLoops(spinModule) has sha256 %s at rewriteCacheVersion %d, want %s at %d: when the rewrite changes, raise rewriteCacheVersion and pin the new sum and version here",
			got, rewriteCacheVersion, rewriteOfSpinModule, rewriteOfSpinModuleVersion)
	}
}
