package model

import (
	"strings"
	"testing"
)

// TestWordsCountsWhatFieldsFuncSplits holds words to its definition: the
// fields strings.FieldsFunc splits out at the separators, multi-byte and
// invalid UTF-8 included.
func TestWordsCountsWhatFieldsFuncSplits(t *testing.T) {
	separator := func(r rune) bool {
		return r == ' ' || r == '\n' || r == '\t' || r == '"' || r == ',' || r == ':' || r == '{' || r == '}'
	}
	for _, s := range []string{
		"", " ", "one", "one two", "  one  two  ", "a\tb\nc",
		`{"seconds":1,"label":"demo"}`, `{}`, `"",:{}`,
		"héllo wörld ünïcode", "日本語 テキスト", "emoji 🎉 here",
		"bad \xff\xfe utf8", "\xff", "tail,", ",lead", "x{y}z",
		longText,
	} {
		if got, want := words(s), len(strings.FieldsFunc(s, separator)); got != want {
			t.Errorf("words(%q) = %d, FieldsFunc splits %d", s, got, want)
		}
	}
}

// longText is a longer text with every separator in it.
const longText = FallbackText + " " + configureHint + ` {"type":"object","properties":{"seconds":{"type":"number"}}}`
