package httpapi

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// openAPIPaths is what the route test reads of the document: the
// operations (by method, in lower case) of each path.
type openAPIPaths struct {
	Paths map[string]map[string]json.RawMessage `json:"paths"`
}

// The keys of a Path Item that are operations (OpenAPI 3.1, 4.8.9).
var openAPIMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// openAPIPath is the document's path of a route's pattern: ServeMux's
// {$}, which ends a path, is not OpenAPI's.
func openAPIPath(pattern string) string { return strings.TrimSuffix(pattern, "{$}") }

// routeTestServer is a Server with every route: /metrics too.
func routeTestServer(t *testing.T) *Server {
	t.Helper()
	auth, err := NewTokenAuthenticator(nil)
	require.NoError(t, err)
	s, err := New(Config{Runtime: (*runtime.Runtime)(nil), Store: &sliceStore{}, Auth: auth, Metrics: http.NotFoundHandler()})
	require.NoError(t, err)
	return s
}

// TestEveryRouteIsInTheOpenAPIDocumentAndBack: every route of the route
// table (the server registers those and no others) has its operation in
// openapi.json, by method and path, and every operation of the document
// is a route the server serves: a route added without its description,
// or a description of a route that does not exist, fails here.
func TestEveryRouteIsInTheOpenAPIDocumentAndBack(t *testing.T) {
	s := routeTestServer(t)
	var doc openAPIPaths
	require.NoError(t, json.Unmarshal(openAPIDocument, &doc))

	routes := map[string]string{} // "METHOD path" -> its pattern
	for _, rt := range s.routeTable() {
		routes[rt.method+" "+openAPIPath(rt.pattern)] = rt.pattern
	}
	documented := map[string]bool{}
	for path, item := range doc.Paths {
		for key := range item {
			if slices.Contains(openAPIMethods, key) {
				documented[strings.ToUpper(key)+" "+path] = true
			}
		}
	}
	require.GreaterOrEqual(t, len(routes), 14, "routes in the table")
	for op := range routes {
		if !documented[op] {
			t.Errorf("the server serves %s, but openapi.json does not describe it: add its operation (parameters, request body, every answer) under paths", op)
		}
	}
	for op := range documented {
		if _, ok := routes[op]; !ok {
			t.Errorf("openapi.json describes %s, but the server has no such route: remove the operation, or add the route to routeTable", op)
		}
	}

	// The server's router sends each documented operation to the route
	// of the table that it documents.
	param := regexp.MustCompile(`\{[^}]+\}`)
	for op := range documented {
		method, path, _ := strings.Cut(op, " ")
		req := httptest.NewRequest(method, param.ReplaceAllString(path, "p1"), nil)
		_, pattern := s.mux.Handler(req)
		if want, ok := routes[op]; ok && pattern != method+" "+want {
			t.Errorf("%s %s reaches the route %q, not %q", method, req.URL.Path, pattern, method+" "+want)
		}
	}
}

// TestEveryErrorCodeIsInTheOpenAPIDocument: the error codes of the
// package (its Code… constants) are the document's list of error codes,
// no more and no fewer, and each is an answer's code somewhere, but for
// the two any path can get (not_found, method_not_allowed), which
// info.description names.
func TestEveryErrorCodeIsInTheOpenAPIDocument(t *testing.T) {
	codes := errorCodeConstants(t)
	require.GreaterOrEqual(t, len(codes), 20, "error codes found in the package")
	var doc struct {
		Info       struct{ Description string } `json:"info"`
		Components struct {
			Schemas struct {
				Error struct {
					Properties struct {
						Error struct {
							Properties struct {
								Code struct {
									Enum []string `json:"enum"`
								} `json:"code"`
							} `json:"properties"`
						} `json:"error"`
					} `json:"properties"`
				} `json:"Error"`
			} `json:"schemas"`
			Responses map[string]json.RawMessage `json:"responses"`
		} `json:"components"`
	}
	require.NoError(t, json.Unmarshal(openAPIDocument, &doc))
	listed := doc.Components.Schemas.Error.Properties.Error.Properties.Code.Enum
	for name, code := range codes {
		if !slices.Contains(listed, code) {
			t.Errorf("error code %q (%s) is not in openapi.json: add it to components.schemas.Error's code, and to the answers that carry it", code, name)
		}
	}
	for _, code := range listed {
		found := false
		for _, c := range codes {
			found = found || c == code
		}
		if !found {
			t.Errorf("openapi.json lists the error code %q, which the package does not define", code)
		}
	}
	for _, code := range listed {
		answered := false
		for _, resp := range doc.Components.Responses {
			answered = answered || strings.Contains(string(resp), strconv.Quote(code))
		}
		if !answered && !strings.Contains(doc.Info.Description, "`"+code+"`") {
			t.Errorf("no answer of openapi.json carries the error code %q: add it to the components.responses of the statuses that answer it", code)
		}
	}
}

// errorCodeConstants returns the string constants named Code… of the
// package's source, by name.
func errorCodeConstants(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	codes := map[string]string{}
	fset := token.NewFileSet()
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		require.NoError(t, err)
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if !strings.HasPrefix(name.Name, "Code") || i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					v, err := strconv.Unquote(lit.Value)
					require.NoError(t, err)
					codes[name.Name] = v
				}
			}
		}
	}
	return codes
}

// TestTheOpenAPIErrorClassesAreTheABIs: components.schemas.ErrorClass
// lists abi.ErrorClasses, in their order: a class added to the ABI (such
// as rate_limited) without its description fails here.
func TestTheOpenAPIErrorClassesAreTheABIs(t *testing.T) {
	var doc struct {
		Components struct {
			Schemas struct {
				ErrorClass struct {
					Enum []string `json:"enum"`
				} `json:"ErrorClass"`
			} `json:"schemas"`
		} `json:"components"`
	}
	require.NoError(t, json.Unmarshal(openAPIDocument, &doc))
	var want []string
	for _, c := range abi.ErrorClasses {
		want = append(want, string(c))
	}
	require.Equal(t, want, doc.Components.Schemas.ErrorClass.Enum, "components.schemas.ErrorClass of openapi.json")
}
