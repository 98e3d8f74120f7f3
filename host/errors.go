package host

import "errors"

// Sentinel errors of loading. Load wraps them with the plugin's name and
// what to do; check them with errors.Is.
var (
	// ErrABIMismatch: the module has no marker of an ABI version this host
	// supports.
	ErrABIMismatch = errors.New("host: ABI version mismatch")
	// ErrImportRefused: the module imports something the host does not
	// offer, or with another wasm type.
	ErrImportRefused = errors.New("host: import refused")
	// ErrExportMissing: an export its role requires is missing or has the
	// wrong wasm type.
	ErrExportMissing = errors.New("host: required export missing")
	// ErrHashMismatch: the file's sha256 is not the pinned one.
	ErrHashMismatch = errors.New("host: sha256 mismatch")
	// ErrDescribe: describe failed, or its reply breaks the ABI or names
	// another role than the caller expects.
	ErrDescribe = errors.New("host: describe refused")
	// ErrClosed: the host or the plugin is closed.
	ErrClosed = errors.New("host: closed")
)
