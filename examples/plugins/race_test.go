//go:build race

package examples_test

// raceEnabled is true under -race, where loading a plugin costs seconds.
const raceEnabled = true
