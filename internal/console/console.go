package console

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed assets
var assets embed.FS

// Prefix is the path the console is served under.
const Prefix = "/console/"

// ContentSecurityPolicy is the Content-Security-Policy of every answer of
// the console: its own scripts, styles and images only, fetches to its
// own origin only (the API), no frames, no <base>, forms to itself.
const ContentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"

// Handler serves the console's files under Prefix. It answers GET and
// HEAD only (the caller's routes say so), with the security headers on
// every answer, its 404s included.
func Handler() http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic("console: the embedded assets have no assets directory: " + err.Error())
	}
	files := http.StripPrefix(strings.TrimSuffix(Prefix, "/"), http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		SetHeaders(w.Header())
		// The files change with the binary only; a browser checks back
		// each time rather than run an old console against a new API.
		w.Header().Set("Cache-Control", "no-cache")
		if rest := strings.TrimPrefix(r.URL.Path, Prefix); rest != "" && strings.HasSuffix(rest, "/") {
			http.NotFound(w, r) // no listings of the asset folders
			return
		}
		files.ServeHTTP(w, r)
	})
}

// WithHeaders sets the console's security headers, before next runs, on
// the answer to every request for a path of the console in any spelling
// that path cleaning turns into one (/console, /console//x,
// /x/../console/): the redirects to the clean path and the 405s that the
// server's routing answers before Handler is reached carry them too.
func WithHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if IsPath(r.URL.Path) {
			SetHeaders(w.Header())
		}
		next.ServeHTTP(w, r)
	})
}

// IsPath reports whether p, once cleaned, is the console's: Prefix
// without its slash, or under Prefix.
func IsPath(p string) bool {
	clean := path.Clean("/" + p)
	return clean == strings.TrimSuffix(Prefix, "/") || strings.HasPrefix(clean, Prefix)
}

// SetHeaders sets the console's security headers on h.
func SetHeaders(h http.Header) {
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
}
