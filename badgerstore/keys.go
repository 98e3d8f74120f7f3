package badgerstore

import (
	"encoding/binary"
	"fmt"
)

// Table bytes: the first byte of every key names what the key holds. The
// layout is documented in doc.go; change both together and bump
// formatVersion.
const (
	tMeta       = 0x00 // tMeta lp(name)
	tRun        = 'r'  // tRun lp(tenant) lp(run) → run record
	tEvent      = 'e'  // tEvent lp(tenant) lp(run) be64(seq) → event JSON
	tCommand    = 'c'  // tCommand lp(tenant) lp(run) lp(command) → be64(seq)
	tCreateCmd  = 'C'  // tCreateCmd lp(tenant) lp(command) → run ID
	tOrdinal    = 'q'  // tOrdinal lp(tenant) lp(session) → be64(last ordinal)
	tOrder      = 'o'  // tOrder lp(tenant) lp(session) be64(ordinal) → run ID
	tActive     = 'a'  // tActive lp(tenant) lp(session) be64(ordinal) → run ID
	tLive       = 'l'  // tLive lp(tenant) lp(session) → be64(non-terminal Runs)
	tStatus     = 's'  // tStatus lp(tenant) lp(status) run → empty
	tExecuting  = 'x'  // tExecuting lp(tenant) lp(session) be64(ordinal) lp(effect) → EffectRecord JSON
	tOwner      = 'w'  // tOwner lp(tenant) lp(session) → owner JSON
	tNode       = 'n'  // tNode lp(node) → node JSON
	tTerminal   = 'u'  // tTerminal be64(updated_at) lp(tenant) lp(run) → empty
	tKV         = 'k'  // tKV lp(tenant) lp(plugin) lp(key) → value
	tKVUsage    = 'K'  // tKVUsage lp(tenant) lp(plugin) → be64(bytes used)
	metaFormat  = "format"
	metaOpenGen = "open_generation"
)

// key builds a key: a table byte, then components. A string or []byte
// component is length-prefixed (uvarint length, then the bytes); a uint64
// is 8 bytes big-endian, so it sorts numerically. A raw component (the
// tail of a status-index key) is appended as it is.
type key []byte

func newKey(table byte) key { return key{table} }

func (k key) str(s string) key {
	k = binary.AppendUvarint(k, uint64(len(s)))
	return append(k, s...)
}

func (k key) bytes(b []byte) key {
	k = binary.AppendUvarint(k, uint64(len(b)))
	return append(k, b...)
}

func (k key) u64(v uint64) key { return binary.BigEndian.AppendUint64(k, v) }

func (k key) raw(s string) key { return append(k, s...) }

// keyReader decodes the components of a key in the order they were
// appended.
type keyReader struct {
	b   []byte
	err error
}

func readKey(b []byte, table byte) *keyReader {
	r := &keyReader{b: b}
	if len(b) == 0 || b[0] != table {
		r.err = fmt.Errorf("badgerstore: key %x is not in table %q", b, table)
		return r
	}
	r.b = b[1:]
	return r
}

func (r *keyReader) str() string {
	if r.err != nil {
		return ""
	}
	n, w := binary.Uvarint(r.b)
	if w <= 0 || uint64(len(r.b)-w) < n {
		r.err = fmt.Errorf("badgerstore: malformed key component %x", r.b)
		return ""
	}
	s := string(r.b[w : w+int(n)])
	r.b = r.b[w+int(n):]
	return s
}

func (r *keyReader) u64() uint64 {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 8 {
		r.err = fmt.Errorf("badgerstore: malformed key integer %x", r.b)
		return 0
	}
	v := binary.BigEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *keyReader) rest() string {
	s := string(r.b)
	r.b = nil
	return s
}

func be64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func readBE64(b []byte) (uint64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("badgerstore: a counter holds %d bytes, want 8", len(b))
	}
	return binary.BigEndian.Uint64(b), nil
}

func runKey(tenant, run string) key { return newKey(tRun).str(tenant).str(run) }
func eventPrefix(tenant, run string) key {
	return newKey(tEvent).str(tenant).str(run)
}
func eventKey(tenant, run string, seq int64) key { return eventPrefix(tenant, run).u64(uint64(seq)) }
func commandPrefix(tenant, run string) key       { return newKey(tCommand).str(tenant).str(run) }
func commandKey(tenant, run, cmd string) key     { return commandPrefix(tenant, run).str(cmd) }
func createCmdKey(tenant, cmd string) key        { return newKey(tCreateCmd).str(tenant).str(cmd) }
func ordinalKey(tenant, session string) key      { return newKey(tOrdinal).str(tenant).str(session) }
func orderPrefix(tenant, session string) key     { return newKey(tOrder).str(tenant).str(session) }
func activePrefix(tenant, session string) key    { return newKey(tActive).str(tenant).str(session) }
func liveKey(tenant, session string) key         { return newKey(tLive).str(tenant).str(session) }
func statusPrefix(tenant, status string) key     { return newKey(tStatus).str(tenant).str(status) }
func executingPrefix(tenant, session string) key {
	return newKey(tExecuting).str(tenant).str(session)
}
func ownerKey(tenant, session string) key { return newKey(tOwner).str(tenant).str(session) }
func nodeKey(node string) key             { return newKey(tNode).str(node) }
func terminalKey(updatedAt int64, tenant, run string) key {
	return newKey(tTerminal).u64(uint64(updatedAt)).str(tenant).str(run)
}
func kvKey(tenant, plugin string, k []byte) key { return newKey(tKV).str(tenant).str(plugin).bytes(k) }
func kvUsageKey(tenant, plugin string) key      { return newKey(tKVUsage).str(tenant).str(plugin) }
func metaKey(name string) key                   { return newKey(tMeta).str(name) }
