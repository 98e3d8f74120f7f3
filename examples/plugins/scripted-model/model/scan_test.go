package model

import (
	"math/rand/v2"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// The regular expressions the hand-written scanners stand in for.
var (
	candidateRE = regexp.MustCompile(`[-+*/%^().0-9 \t]+`)
	useFormRE   = useForm
)

// scanTexts are texts for the scanners: the model's examples, the edges,
// and characters that fold to u or s (ſ, the long s) in other scripts.
var scanTexts = []string{
	"", " ", "What is (2+3)*4?", "What is 2+3 and 4*5?", "what is 2 + 3.",
	"compute 1.5*2, then 7 % 4!", "\t2^10\t", "-3", "((", "a1b2c3",
	"use calculate {\"expression\": \"2^10\"}", "  USE word_count", "\n\fuse x", "Use", "uſe calculate",
	"ůse x", "\vuse x", "\u00a0use x", "\u2028use x", "use", "u", "usex",
	"run a slow job for 3 seconds", longText,
}

// randomText draws a text from an alphabet of expression characters,
// letters, white space and multi-byte characters.
func randomText(r *rand.Rand) string {
	alphabet := []string{"0", "7", "+", "-", "*", "/", "%", "^", "(", ")", ".", " ", "\t", "\n", "\f", "\r", "\v",
		"u", "U", "s", "S", "e", "E", "ſ", "K", "x", "_", "{", "}", "\"", "é", "🎉", "\xff"}
	var b strings.Builder
	for n := r.IntN(24); n > 0; n-- {
		b.WriteString(alphabet[r.IntN(len(alphabet))])
	}
	return b.String()
}

// TestCandidatesFindWhatTheRegexpFinds holds candidates to its definition:
// the matches of `[-+*/%^().0-9 \t]+`.
func TestCandidatesFindWhatTheRegexpFinds(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	texts := append([]string(nil), scanTexts...)
	for range 20000 {
		texts = append(texts, randomText(r))
	}
	for _, s := range texts {
		if got, want := candidates(s), candidateRE.FindAllString(s, -1); !reflect.DeepEqual(got, want) {
			t.Fatalf("candidates(%q) = %q, the regexp finds %q", s, got, want)
		}
	}
}

// TestMayUseWhereverUseFormMatches checks that the prefilter of useRule
// never skips a text the form matches, and skips most that it does not.
func TestMayUseWhereverUseFormMatches(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	texts := append([]string(nil), scanTexts...)
	for range 20000 {
		t := randomText(r)
		texts = append(texts, t, "use"+t, " Use "+t, "\tuSe\n"+t)
	}
	skipped := 0
	for _, s := range texts {
		match := useFormRE.MatchString(s)
		if match && !mayUse(s) {
			t.Fatalf("mayUse(%q) is false, but the form matches", s)
		}
		if !mayUse(s) {
			skipped++
		}
	}
	if skipped == 0 {
		t.Fatal("mayUse skipped no text")
	}
}
