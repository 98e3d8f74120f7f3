package runtime_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// The package's source, runtime/internal/* included, as the tests below
// read it.
type sourcePackage struct {
	name  string // "runtime", or the internal package's name
	files []*ast.File
}

func parseRuntimeSource(t *testing.T) (*token.FileSet, []sourcePackage) {
	t.Helper()
	fset := token.NewFileSet()
	dirs := []string{"."}
	internal, err := filepath.Glob(filepath.Join("internal", "*"))
	if err != nil {
		t.Fatal(err)
	}
	dirs = append(dirs, internal...)
	var pkgs []sourcePackage
	for _, dir := range dirs {
		names, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		var p sourcePackage
		for _, name := range names {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			p.name = f.Name.Name
			p.files = append(p.files, f)
		}
		if len(p.files) > 0 {
			pkgs = append(pkgs, p)
		}
	}
	return fset, pkgs
}

// docSection returns the "# Goroutines and locks" section of doc.go's
// package comment, split at the list of mutexes.
func docSection(t *testing.T) (goroutines, locks string) {
	t.Helper()
	raw, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	start := strings.Index(doc, "// # Goroutines and locks")
	if start < 0 {
		t.Fatal(`doc.go has no "# Goroutines and locks" section: it must name every goroutine the runtime starts and every mutex, with what it guards and the lock order`)
	}
	doc = doc[start+len("// # Goroutines and locks"):]
	if end := strings.Index(doc, "\n// # "); end >= 0 {
		doc = doc[:end]
	}
	split := strings.Index(doc, "Every mutex")
	if split < 0 {
		t.Fatal(`doc.go's "# Goroutines and locks" section has no list of mutexes ("Every mutex ...")`)
	}
	// Undo the comment's line breaks, so that a name broken over two
	// lines, like "RecoverNow's\n// mu", still reads as one.
	flat := func(s string) string {
		return strings.Join(strings.Fields(strings.ReplaceAll(s, "//", " ")), " ")
	}
	return flat(doc[:split]), flat(doc[split:])
}

// names reports whether text names name as a whole word.
func names(text, name string) bool {
	return regexp.MustCompile(`(^|[^\w])` + regexp.QuoteMeta(name) + `($|[^\w])`).MatchString(text)
}

// funcName is the name of a function declaration, with its receiver's type
// for a method ("tail.read").
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	rt := fd.Recv.List[0].Type
	if s, ok := rt.(*ast.StarExpr); ok {
		rt = s.X
	}
	if id, ok := rt.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}

// goroutineStarts lists, for each place the source starts a goroutine or
// arms a Clock timer (a go statement, an AfterFunc, goTracked, a
// ChangeFeed subscription), the names doc.go must give it: the function
// that starts it, and the method it runs when it names one.
func goroutineStarts(fset *token.FileSet, pkgs []sourcePackage) map[string][]string {
	want := map[string][]string{} // name -> where
	add := func(name string, pos token.Pos) {
		want[name] = append(want[name], fset.Position(pos).String())
	}
	method := func(e ast.Expr) string {
		if sel, ok := e.(*ast.SelectorExpr); ok {
			return sel.Sel.Name
		}
		return ""
	}
	for _, p := range pkgs {
		for _, f := range p.files {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil || fd.Name.Name == "AfterFunc" {
					continue // a Clock's AfterFunc passes its callback on
				}
				encl := fd.Name.Name
				ast.Inspect(fd.Body, func(n ast.Node) bool {
					switch x := n.(type) {
					case *ast.GoStmt:
						add(encl, x.Pos())
						if m := method(x.Call.Fun); m != "" {
							add(m, x.Pos())
						}
					case *ast.CallExpr:
						switch method(x.Fun) {
						case "AfterFunc", "goTracked", "SubscribeChanges":
							add(encl, x.Pos())
							if len(x.Args) > 0 {
								if m := method(x.Args[len(x.Args)-1]); m != "" {
									add(m, x.Pos())
								}
							}
						}
					}
					return true
				})
			}
		}
	}
	return want
}

// mutexes lists every sync.Mutex of the source, by the name doc.go gives
// it: "Type.field" (with the package for an internal one,
// "attempts.Table.mu"), or "Func's name" for a local variable, and
// reports those that have no comment saying what they guard.
func mutexes(fset *token.FileSet, pkgs []sourcePackage) (all map[string]string, undocumented []string) {
	all = map[string]string{}
	isMutex := func(e ast.Expr) bool {
		sel, ok := e.(*ast.SelectorExpr)
		if !ok {
			return false
		}
		id, ok := sel.X.(*ast.Ident)
		return ok && id.Name == "sync" && (sel.Sel.Name == "Mutex" || sel.Sel.Name == "RWMutex")
	}
	for _, p := range pkgs {
		prefix := ""
		if p.name != "runtime" {
			prefix = p.name + "."
		}
		for _, f := range p.files {
			for _, d := range f.Decls {
				switch d := d.(type) {
				case *ast.GenDecl:
					for _, s := range d.Specs {
						ts, ok := s.(*ast.TypeSpec)
						if !ok {
							continue
						}
						st, ok := ts.Type.(*ast.StructType)
						if !ok {
							continue
						}
						for _, fl := range st.Fields.List {
							if !isMutex(fl.Type) {
								continue
							}
							for _, n := range fl.Names {
								key := prefix + ts.Name.Name + "." + n.Name
								all[key] = fset.Position(n.Pos()).String()
								if fl.Doc == nil || strings.TrimSpace(fl.Doc.Text()) == "" {
									undocumented = append(undocumented, key)
								}
							}
						}
					}
				case *ast.FuncDecl:
					if d.Body == nil {
						continue
					}
					ast.Inspect(d.Body, func(n ast.Node) bool {
						vs, ok := n.(*ast.ValueSpec)
						if !ok || vs.Type == nil || !isMutex(vs.Type) {
							return true
						}
						for _, name := range vs.Names {
							key := d.Name.Name + "'s " + name.Name
							all[key] = fset.Position(name.Pos()).String()
							if vs.Doc == nil || strings.TrimSpace(vs.Doc.Text()) == "" {
								undocumented = append(undocumented, key)
							}
						}
						return true
					})
				}
			}
		}
	}
	return all, undocumented
}

// doc.go's "Goroutines and locks" names every goroutine the runtime starts
// (and the function that starts it) and every mutex, and every mutex has a
// comment at its declaration saying what it guards: a goroutine or a lock
// added without them fails here.
func TestDocNamesEveryGoroutineAndLock(t *testing.T) {
	fset, pkgs := parseRuntimeSource(t)
	goroutines, locks := docSection(t)

	starts := goroutineStarts(fset, pkgs)
	var missing []string
	for name, where := range starts {
		if !names(goroutines, name) {
			missing = append(missing, name+" (at "+strings.Join(where, ", ")+")")
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("doc.go's list of goroutines does not name %s: add the goroutine there, with who starts it and what it may lock", m)
	}
	if len(starts) < 10 {
		t.Fatalf("found only %d places that start goroutines; the scan of the source is broken", len(starts))
	}

	all, undocumented := mutexes(fset, pkgs)
	missing = missing[:0]
	for key, where := range all {
		if !names(locks, key) {
			missing = append(missing, key+" (at "+where+")")
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("doc.go's list of mutexes does not name %s: add it there, with what it guards and where it sits in the lock order", m)
	}
	sort.Strings(undocumented)
	for _, key := range undocumented {
		t.Errorf("mutex %s (at %s) has no comment saying what it guards", key, all[key])
	}
	if len(all) < 12 {
		t.Fatalf("found only %d mutexes; the scan of the source is broken", len(all))
	}
}

// Every advanceReq is made by one of its constructors, each of which says
// what prompts the advance: a composite literal anywhere else (a new kind
// of advance made of flags) fails here.
func TestEveryAdvanceIsMadeByAConstructorOfItsKind(t *testing.T) {
	fset, pkgs := parseRuntimeSource(t)
	raw, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	constructors := 0
	for _, p := range pkgs {
		if p.name != "runtime" {
			continue
		}
		for _, f := range p.files {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				returnsReq := fd.Recv == nil && fd.Type.Results != nil && len(fd.Type.Results.List) == 1
				if returnsReq {
					id, ok := fd.Type.Results.List[0].Type.(*ast.Ident)
					returnsReq = ok && id.Name == "advanceReq"
				}
				literals := 0
				ast.Inspect(fd.Body, func(n ast.Node) bool {
					if cl, ok := n.(*ast.CompositeLit); ok {
						if id, ok := cl.Type.(*ast.Ident); ok && id.Name == "advanceReq" {
							literals++
							if !returnsReq {
								t.Errorf("%s: %s builds an advanceReq itself; use (or add) a constructor that says what prompts the advance",
									fset.Position(cl.Pos()), funcName(fd))
							}
						}
					}
					return true
				})
				if returnsReq && literals > 0 {
					constructors++
					if !names(string(raw), fd.Name.Name) {
						t.Errorf("the advanceReq constructor %s is not named in doc.go", fd.Name.Name)
					}
				}
			}
		}
	}
	if constructors == 0 {
		t.Fatal("found no constructor of advanceReq; the scan of the source is broken")
	}
}
