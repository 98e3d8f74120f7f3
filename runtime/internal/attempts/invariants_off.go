//go:build !invariants

package attempts

// invariants is false in a build without the invariants tag: an illegal
// attempt transition is an error the caller logs, not a panic.
const invariants = false
