package abi

import (
	"encoding/json"
	"reflect"
	"testing"
)

var fuzzExports = []string{ExportStart, ExportPoll, ExportAttach}

// FuzzDecodeEffectReply checks that DecodeEffectReply never panics, and
// that whatever it accepts re-encodes into a reply that it accepts again,
// with the same meaning.
func FuzzDecodeEffectReply(f *testing.F) {
	for _, tc := range effectReplyCases {
		f.Add([]byte(tc.json), tc.kind == KindModel, uint8(indexOf(fuzzExports, tc.export)))
	}
	f.Fuzz(func(t *testing.T, data []byte, model bool, exp uint8) {
		kind := KindTool
		if model {
			kind = KindModel
		}
		export := fuzzExports[int(exp)%len(fuzzExports)]
		r, err := DecodeEffectReply(data, kind, export)
		if err != nil {
			if !isFieldError(err) {
				t.Fatalf("refusal %v is not a *FieldError", err)
			}
			return
		}
		if err := ValidateEffectReply(r, kind, export); err != nil {
			t.Fatalf("Validate refuses what Decode accepted: %v", err)
		}
		again, err := json.Marshal(r)
		if err != nil {
			t.Fatalf("an accepted reply does not re-encode: %v", err)
		}
		r2, err := DecodeEffectReply(again, kind, export)
		if err != nil {
			t.Fatalf("the re-encoded reply %s is refused: %v", again, err)
		}
		if r2.State != r.State || r2.Handle != r.Handle || r2.PollAfterMS != r.PollAfterMS || !reflect.DeepEqual(r2.Error, r.Error) {
			t.Fatalf("the reply changed meaning across a round trip:\n%+v\n%+v", r, r2)
		}
		if r.State == StateDone {
			sameOutcome(t, kind, r.Outcome, r2.Outcome)
		}
	})
}

// sameOutcome fails t unless two accepted outcomes decode to the same value.
func sameOutcome(t *testing.T, kind EffectKind, a, b json.RawMessage) {
	t.Helper()
	var x, y any
	var errA, errB error
	if kind == KindModel {
		x, errA = DecodeModelOutcome(a)
		y, errB = DecodeModelOutcome(b)
	} else {
		x, errA = DecodeToolOutcome(a)
		y, errB = DecodeToolOutcome(b)
	}
	if errA != nil || errB != nil {
		t.Fatalf("an accepted outcome does not decode: %v / %v", errA, errB)
	}
	ja, _ := json.Marshal(x)
	jb, _ := json.Marshal(y)
	if string(ja) != string(jb) {
		t.Fatalf("the outcome changed across a round trip:\n%s\n%s", ja, jb)
	}
}

// FuzzDecodeDescribe checks that DecodeDescribe never panics, and that
// whatever it accepts re-encodes into a describe reply it accepts again.
func FuzzDecodeDescribe(f *testing.F) {
	seeds := []string{
		`{"abi":1,"name":"calculator","version":"0.1.0","role":"executor","effects":["tool"],"tools":[{"name":"calculate","input_schema":{"type":"object"},"idempotent":true,"approval":"never"}],"attach":true}`,
		`{"abi":1,"name":"chat","role":"builder"}`,
		`{"abi":1,"name":"llm","role":"executor","effects":["model"]}`,
		`{"abi":2,"name":"future","role":"executor","effects":["model"]}`,
		`{"abi":1,"name":"x","role":"executor","effects":["tool"],"tools":[{"name":"a b","input_schema":[]}]}`,
		`{"abi":1,"name":"x","role":"executor","effects":["tool","tool"],"tools":[{"name":"a","input_schema":{"type":"string"}}]}`,
		`[]`, `null`, ``, `{"abi":"1"}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := DecodeDescribe(data, "")
		if err != nil {
			if !isFieldError(err) {
				t.Fatalf("refusal %v is not a *FieldError", err)
			}
			return
		}
		if err := ValidateDescribe(d, d.Role); err != nil {
			t.Fatalf("Validate refuses what Decode accepted: %v", err)
		}
		again, err := json.Marshal(d)
		if err != nil {
			t.Fatalf("an accepted describe does not re-encode: %v", err)
		}
		d2, err := DecodeDescribe(again, d.Role)
		if err != nil {
			t.Fatalf("the re-encoded describe %s is refused: %v", again, err)
		}
		if d2.Name != d.Name || d2.Role != d.Role || len(d2.Tools) != len(d.Tools) || !reflect.DeepEqual(d2.Effects, d.Effects) {
			t.Fatalf("describe changed across a round trip:\n%+v\n%+v", d, d2)
		}
	})
}

func isFieldError(err error) bool {
	_, ok := err.(*FieldError)
	return ok
}

func indexOf(xs []string, s string) int {
	for i, x := range xs {
		if x == s {
			return i
		}
	}
	return -1
}
