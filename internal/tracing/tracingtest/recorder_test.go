package tracingtest

import (
	"context"
	"fmt"
	"testing"

	"go.opentelemetry.io/otel"
)

// packageTracer is made at init, as a package's tracer is.
var packageTracer = otel.Tracer("github.com/agenthost/agenthost/internal/tracing/tracingtest/example")

// TestRecordServesEveryTestThatCallsIt: tests that record one after the
// other each get the spans of a tracer made at init, and only theirs;
// once none records, that tracer's spans record nothing. Before Record
// installed one provider for good, every Record after a binary's first
// got none (go test -count=2 of a test that records).
func TestRecordServesEveryTestThatCallsIt(t *testing.T) {
	for i := range 3 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			rec := Record(t)
			_, span := packageTracer.Start(context.Background(), fmt.Sprint("work ", i))
			span.End()
			ended := rec.Ended()
			if len(ended) != 1 || ended[0].Name() != fmt.Sprint("work ", i) {
				t.Fatalf("the recorder holds %d ended spans, want the one of test %d", len(ended), i)
			}
		})
	}
	if _, span := packageTracer.Start(context.Background(), "after"); span.IsRecording() {
		t.Fatal("a span started once no test records is recording")
	}
}

// fatalTB stops a Record at its Fatal, with the message kept.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	panic(f)
}

// TestRecordRefusesASecondRecorderAtOnce: a Record while another test's is
// in force fails its test (parallel tests would take each other's spans),
// and leaves the first one recording.
func TestRecordRefusesASecondRecorderAtOnce(t *testing.T) {
	rec := Record(t)
	second := &fatalTB{TB: t}
	func() {
		defer func() {
			if r := recover(); r != second {
				panic(r)
			}
		}()
		Record(second)
	}()
	if second.msg == "" {
		t.Fatal("a second Record at once did not fail its test")
	}
	_, span := packageTracer.Start(context.Background(), "still")
	span.End()
	if len(rec.Ended()) != 1 {
		t.Fatalf("the first recorder holds %d ended spans after the refused one, want 1", len(rec.Ended()))
	}
}
