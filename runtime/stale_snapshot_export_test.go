package runtime

// UnknownEffectReloads is unknownEffectReloads, for the tests of
// commitOutcome's retries.
const UnknownEffectReloads = unknownEffectReloads
