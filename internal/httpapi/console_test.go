package httpapi_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/internal/console"
)

// The console is served on the API's listener, without a token, with its
// security headers; / leads to it.
func TestTheConsoleIsServedWithItsHeaders(t *testing.T) {
	e := newEnv(t)
	for path, ctype := range map[string]string{
		"/console/":            "text/html",
		"/console/js/app.js":   "text/javascript",
		"/console/console.css": "text/css",
	} {
		r := e.do("GET", path, "", "")
		require.Equal(t, http.StatusOK, r.Status, path)
		require.True(t, strings.HasPrefix(r.Header.Get("Content-Type"), ctype), "%s: Content-Type %q", path, r.Header.Get("Content-Type"))
		require.Equal(t, console.ContentSecurityPolicy, r.Header.Get("Content-Security-Policy"), path)
		require.Equal(t, "DENY", r.Header.Get("X-Frame-Options"), path)
		require.Equal(t, "nosniff", r.Header.Get("X-Content-Type-Options"), path)
		require.Equal(t, "no-referrer", r.Header.Get("Referrer-Policy"), path)
	}
	require.Contains(t, console.ContentSecurityPolicy, "script-src 'self';")
	require.Contains(t, console.ContentSecurityPolicy, "frame-ancestors 'none'")
	require.NotContains(t, console.ContentSecurityPolicy, "unsafe-inline")

	req, err := http.NewRequest("GET", e.ts.URL+"/", nil)
	require.NoError(t, err)
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusFound, resp.StatusCode)
	require.Equal(t, "/console/", resp.Header.Get("Location"))

	// No listing of the asset folders, no such file: 404, with the headers.
	for _, path := range []string{"/console/js/", "/console/nope.js"} {
		r := e.do("GET", path, "", "")
		require.Equal(t, http.StatusNotFound, r.Status, path)
		require.Equal(t, console.ContentSecurityPolicy, r.Header.Get("Content-Security-Policy"), path)
	}
	// The console is read only: other methods are refused.
	require.Equal(t, http.StatusMethodNotAllowed, e.do("POST", "/console/", "", "x").Status)
}
