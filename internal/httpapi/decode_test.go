package httpapi_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/internal/httpapi"
)

// FuzzInputRequest holds DecodeInputRequest to its contract on any body:
// it never panics; it either refuses the body with a 400 or 413 error, or
// returns exactly one of a non-empty message or well-formed approvals
// (each with a tool call ID and an explicit decision, no ID twice).
func FuzzInputRequest(f *testing.F) {
	for _, seed := range []string{
		`{"message": "blue"}`,
		`{"approvals": [{"tool_call_id": "call_1_1", "approved": true}]}`,
		`{"approvals": [{"tool_call_id": "a", "approved": false, "reason": "no"}, {"tool_call_id": "b", "approved": true}]}`,
		`{"approvals": [{"tool_call_id": "a"}]}`,
		`{"approvals": [{"tool_call_id": "a", "approved": true}, {"tool_call_id": "a", "approved": false}]}`,
		`{"approvals": []}`,
		`{"message": ""}`,
		`{"message": "a", "approvals": [{"tool_call_id": "a", "approved": true}]}`,
		`{"message": null}`,
		`{"msg": "a"}`,
		`{"message": 7}`,
		`{"message": "a"} {"message": "b"}`,
		`[]`, `null`, `"x"`, `{`, ``, `{"approvals": [{"tool_call_id": "", "approved": true}]}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		req, err := httpapi.DecodeInputRequest(strings.NewReader(body))
		if err != nil {
			require.True(t, strings.HasPrefix(err.Error(), "400 ") || strings.HasPrefix(err.Error(), "413 "), "error %v", err)
			return
		}
		if req.Message != nil {
			require.Empty(t, req.Approvals)
			require.NotEmpty(t, strings.TrimSpace(*req.Message))
			return
		}
		require.NotEmpty(t, req.Approvals)
		seen := map[string]bool{}
		for _, a := range req.Approvals {
			require.NotEmpty(t, a.ToolCallID)
			require.NotNil(t, a.Approved)
			require.False(t, seen[a.ToolCallID])
			seen[a.ToolCallID] = true
		}
		require.Len(t, req.Decisions(), len(req.Approvals))
	})
}

func TestDecodeInputRequestOverTheCap(t *testing.T) {
	body := `{"message": "` + strings.Repeat("x", 100) + `"}`
	_, err := httpapi.DecodeInputRequest(http.MaxBytesReader(httptest.NewRecorder(), io.NopCloser(strings.NewReader(body)), 32))
	require.Error(t, err)
	require.Contains(t, err.Error(), "413 body_too_large")
}

func TestTokenAuthenticator(t *testing.T) {
	a, err := httpapi.NewTokenAuthenticator(map[string][]string{
		"acme":   {httpapi.HashToken("t1"), strings.ToUpper(httpapi.HashToken("t2"))},
		"globex": {httpapi.HashToken("t3")},
	})
	require.NoError(t, err)
	for token, want := range map[string]string{"t1": "acme", "t2": "acme", "t3": "globex"} {
		got, ok := a.Authenticate(token)
		require.True(t, ok, token)
		require.Equal(t, want, got)
	}
	for _, token := range []string{"", "t4", httpapi.HashToken("t1")} {
		_, ok := a.Authenticate(token)
		require.False(t, ok, "token %q", token)
	}
	// printf %s demo-token | sha256sum
	require.Equal(t, "7c43ef5ae21d43ce2743f770c68e24def1a43ee2f416d2438410c8af7af2ff2c", httpapi.HashToken("demo-token"))

	_, err = httpapi.NewTokenAuthenticator(map[string][]string{"acme": {"not-hex"}})
	require.ErrorContains(t, err, "64 hex digits")
	_, err = httpapi.NewTokenAuthenticator(map[string][]string{"acme": {httpapi.HashToken("x")}, "globex": {httpapi.HashToken("x")}})
	require.ErrorContains(t, err, "one tenant")
	_, err = httpapi.NewTokenAuthenticator(map[string][]string{"bad tenant": {httpapi.HashToken("x")}})
	require.Error(t, err)
}
