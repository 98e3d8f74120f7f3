package runcodec

import (
	"bytes"
	"encoding/json"
)

// MarshalJSON is the JSON the stores keep: each event of a Run's log, and
// the request of a model step, which its ModelStepPlanned event and the
// Run's snapshot hold. It is json.Marshal's encoding without the HTML
// escaping: encoding/json writes <, > and & as \u003c, \u003e and \u0026,
// six bytes for one, so that JSON can be embedded in an HTML page, which
// stored JSON never is. A tenant's text with many of them (a tool's input
// or result is often code or HTML) would otherwise cost up to six times
// its length in every JSON copy the store keeps: in the store's space and
// in the tenant's storage quota (runtime.Store.TenantStoredBytes).
//
// The output is valid JSON, and any JSON decoder reads it as the same
// value as json.Marshal's output: only the bytes differ, where
// json.Marshal escaped a character this leaves as it is. Every store
// encodes its events with it, so that a Run's events count the same bytes
// in each store. The escapes JSON requires remain (a quote, a backslash,
// a control character), and so do those of U+2028 and U+2029, which
// encoding/json escapes whatever the setting.
//
// A json.RawMessage in v is compacted as it is, with no escaping added:
// raw JSON that whoever wrote it escaped stays escaped, and none is
// escaped further.
func MarshalJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	// Encode ends the value with a newline, which is not part of it. The
	// copy is exactly as long as the value, as json.Marshal's is: a store
	// that keeps it (MemStore does, for good) keeps no buffer's spare room.
	return bytes.Clone(b.Bytes()[:b.Len()-1]), nil
}
