//go:build !invariants

package runtime

// invariants is false in a build without the invariants tag: an illegal
// attempt transition is an error the caller logs, not a panic.
const invariants = false
