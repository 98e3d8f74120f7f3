//go:build invariants

package attempts

// invariants turns the runtime's bookkeeping checks into panics: an
// illegal attempt transition, a busy count below zero, work tracked for a
// Run that has ended. make test builds with -tags invariants.
const invariants = true
