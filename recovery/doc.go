// Package recovery is pure planning for crash recovery: given an orphaned
// effect record, what its executor said on attach, and the effect's
// missing-effect policy, Plan returns the Command to apply, with a command
// ID derived from (EffectID, attempt, decision). It does no I/O and imports
// neither runtime nor any adapter; runtime's recovery driver performs the
// commands.
package recovery
