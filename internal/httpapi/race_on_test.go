//go:build race

package httpapi_test

// raceEnabled is true under the race detector, which makes encoding and
// decoding large JSON many times slower.
const raceEnabled = true
