package host

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
)

// The rewrite cache keeps, beside wazero's compilation cache in
// Config.CacheDir, the module instrumentLoops made of each plugin file,
// by the sha256 of the file. wazero finds its compiled code by the sha256
// of the module it compiles, which for the native path is the rewritten
// one: without this cache every Load would parse and rewrite every
// function of the file again (about 40 ms of a 4 MB Go plugin's cached
// load, docs/BENCHMARKS.md) only to find that the code is compiled
// already.
//
// An entry is the module followed by its CRC-32C (Castagnoli, as wazero
// checks its own cache entries); an entry whose checksum does not match
// (a torn write, a damaged disk) is rewritten again and replaced. A
// change of instrumentLoops's output must change rewriteCacheVersion,
// which names the directory (TestRewriteCacheVersionPinsTheRewrite fails
// until it does).
const rewriteCacheVersion = 1

// rewriteCacheDir is the rewrite cache's directory under dir.
func rewriteCacheDir(dir string) string {
	return filepath.Join(dir, fmt.Sprintf("agenthost-interrupts-v%d", rewriteCacheVersion))
}

// instrumentLoopsCached is instrumentLoops(wasm), whose sha256 is sum,
// through the rewrite cache when the host has a CacheDir. A cache that
// cannot be read or written costs the rewrite, never the load: the
// failure is logged at debug level.
func (h *Host) instrumentLoopsCached(name string, wasm []byte, sum [sha256.Size]byte) ([]byte, error) {
	if h.cfg.CacheDir == "" {
		return instrumentLoops(wasm)
	}
	path := filepath.Join(rewriteCacheDir(h.cfg.CacheDir), hex.EncodeToString(sum[:]))
	if b, err := os.ReadFile(path); err == nil {
		if module, ok := checkedRewrite(b); ok {
			return module, nil
		}
		h.log.Debug("plugin: a cached interrupt rewrite is damaged; rewriting the module again", "plugin", name, "path", path)
	}
	out, err := instrumentLoops(wasm)
	if err != nil {
		return nil, err
	}
	if err := writeRewrite(path, out); err != nil {
		h.log.Debug("plugin: the interrupt rewrite cannot be cached; the next load rewrites the module again", "plugin", name, "error", err)
	}
	return out, nil
}

// castagnoli is the CRC-32C table of the rewrite cache's checksums.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checkedRewrite is the module of the rewrite cache entry b, and whether
// its checksum matches.
func checkedRewrite(b []byte) ([]byte, bool) {
	if len(b) <= 4 {
		return nil, false
	}
	module := b[:len(b)-4]
	return module, crc32.Checksum(module, castagnoli) == binary.LittleEndian.Uint32(b[len(b)-4:])
}

// writeRewrite stores a rewritten module at path: the module, then its
// checksum, written to a temporary file renamed into place, so that loads
// racing on one file each read a whole entry or none.
func writeRewrite(path string, module []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	_, err = f.Write(module)
	if err == nil {
		_, err = f.Write(binary.LittleEndian.AppendUint32(nil, crc32.Checksum(module, castagnoli)))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
	}
	return err
}
