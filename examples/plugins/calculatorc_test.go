package examples_test

import "testing"

// The C calculator gives the same answers and errors as the Go one, on
// the same table.
func TestCalculatorC(t *testing.T) { testCalculator(t, calculatorC) }
