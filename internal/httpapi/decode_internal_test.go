package httpapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// FuzzCheckJSON holds the strict reading of bodies to its contract on any
// input: it never panics; it refuses with a 400 that has a message, or
// accepts only one valid JSON object in valid UTF-8.
func FuzzCheckJSON(f *testing.F) {
	for _, seed := range []string{
		`{"input": "x", "metadata": {"a": [1, {"b": null}]}}`,
		`{"input": "x", "input": "y"}`, `{"INPUT": "x"}`, `{"metadata": {"a": 1, "a": 2}}`,
		`{"input": "\ud83d\ude00"}`, `{"input": "\ud800"}`, `{"input": "\udc00\ud800"}`, "{\"input\": \"\xff\"}",
		`{"metadata": ` + deep(70) + `}`, `[` + deep(70) + `]`, `{} {}`, `{`, ``, `"\`, `\u`, `{"a\\u0041": 1}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		err := checkJSON([]byte(body), submitShape)
		if err != nil {
			var ae *apiError
			require.True(t, errors.As(err, &ae), "error %v", err)
			require.Equal(t, http.StatusBadRequest, ae.Status)
			require.NotEmpty(t, ae.Message)
			return
		}
		require.True(t, utf8.ValidString(body))
		require.True(t, json.Valid([]byte(body)), "accepted %q", body)
	})
}

func deep(n int) string {
	s := "0"
	for range n {
		s = "[" + s + "]"
	}
	return s
}
