package abi

import (
	"strings"
	"testing"
)

// TestAReplyThatIsNotJSONShowsWhereItBreaks checks the offset, the length
// and the excerpt of the error for replies that are not JSON.
func TestAReplyThatIsNotJSONShowsWhereItBreaks(t *testing.T) {
	long := `{"state":"done","outcome":{"content":"` + strings.Repeat("x", 500) + `"` + strings.Repeat("y", 500) + `}}`
	for _, c := range []struct{ name, reply, want string }{
		{"a bad literal", `{"state": fa lse}`, `invalid character ' ' in literal false (expecting 'l') (at byte 13 of 17: "{\"state\": fa" ⟨here⟩ " lse}")`},
		{"leading space counts", "  \n{\"state\": fa lse}", `(at byte 16 of 20: "  \n{\"state\": fa" ⟨here⟩ " lse}")`},
		{"cut short", `{"state":"done"`, `unexpected end of JSON input (at the end, after byte 15: "{\"state\":\"done\"" ⟨here⟩ "")`},
		{"not an object", `nope`, `is not valid JSON (want a JSON object): invalid character 'o' in literal null (expecting 'u') (at byte 2 of 4: "n" ⟨here⟩ "ope")`},
		{"trailing bytes", `{"state":"pending"} x`, `invalid character 'x' after top-level value (at byte 21 of 21: "{\"state\":\"pending\"} " ⟨here⟩ "x")`},
		{"a long reply is cut either side", long, `(at byte 540 of 1041: …"xxxxxxxxxxxxxxxxxxxxxxx\"" ⟨here⟩ "yyyyyyyyyyyyyyyyyyyyyyyy"…)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeEffectReply([]byte(c.reply), KindTool, ExportPoll)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v\nwant …%s…", err, c.want)
			}
			if len(err.Error()) > 300 {
				t.Fatalf("the message is %d bytes: %s", len(err.Error()), err)
			}
		})
	}
}
