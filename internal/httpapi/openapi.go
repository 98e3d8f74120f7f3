package httpapi

import (
	_ "embed"
	"net/http"
	"strconv"
)

// openAPIDocument is the OpenAPI 3.1 description of the API, served at
// GET /v1/openapi.json. It is written by hand, next to the code it
// describes, and kept true by tests: openapi_internal_test.go checks that
// it describes every route of routeTable and no other, and every error
// code; openapi_test.go that real answers of a server match its schemas,
// and that redocly lint finds nothing wrong with it.
//
//go:embed openapi.json
var openAPIDocument []byte

// serveOpenAPIDocument answers with the OpenAPI document.
func serveOpenAPIDocument(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(openAPIDocument)))
	_, _ = w.Write(openAPIDocument)
}
