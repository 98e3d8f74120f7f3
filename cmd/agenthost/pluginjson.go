package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// maxJSONArg bounds a JSON argument read from a file or stdin: over the
// host's largest input (max_input_bytes is at most a few MiB), with room.
const maxJSONArg = 64 << 20

// readJSONArg reads the value of a JSON flag: inline JSON, @FILE for a
// file's content, or - for stdin. A value that is not JSON is refused
// with where it breaks.
func readJSONArg(flag, value string, stdin io.Reader) ([]byte, error) {
	var b []byte
	var from string
	switch {
	case value == "-":
		from = "stdin"
		var err error
		if b, err = io.ReadAll(io.LimitReader(stdin, maxJSONArg+1)); err != nil {
			return nil, fmt.Errorf("%s -: reading stdin: %w", flag, err)
		}
	case strings.HasPrefix(value, "@"):
		path := value[1:]
		from = path
		fi, err := os.Stat(path)
		switch {
		case errors.Is(err, os.ErrNotExist):
			return nil, fmt.Errorf("%s @%s: there is no file %s: give the path of a JSON file after the @", flag, path, path)
		case err != nil:
			return nil, fmt.Errorf("%s @%s: %w", flag, path, err)
		case fi.IsDir():
			return nil, fmt.Errorf("%s @%s: %s is a directory: give the path of a JSON file after the @", flag, path, path)
		}
		if b, err = os.ReadFile(path); err != nil {
			return nil, fmt.Errorf("%s @%s: %w", flag, path, err)
		}
	default:
		from = "the flag's value"
		b = []byte(value)
	}
	if len(b) > maxJSONArg {
		return nil, fmt.Errorf("%s: %s is over %d MiB", flag, from, maxJSONArg>>20)
	}
	if err := checkJSON(b); err != nil {
		return nil, fmt.Errorf("%s: %s is not JSON: %v (quote inline JSON for the shell, e.g. %s '{\"text\":\"one two\"}', or pass @FILE.json)", flag, from, err, flag)
	}
	return b, nil
}

// checkJSON reports where b stops being one JSON value, with an excerpt.
func checkJSON(b []byte) error {
	if len(strings.TrimSpace(string(b))) == 0 {
		return errors.New("it is empty")
	}
	var v any
	err := json.Unmarshal(b, &v)
	if err == nil {
		return nil
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		at := int(se.Offset) - 1 // the byte it stopped at
		if int(se.Offset) >= len(b) {
			at = len(b)
		}
		return fmt.Errorf("%v at byte %d of %d, near %s", se, se.Offset, len(b), excerpt(b, at))
	}
	return err
}

// excerpt quotes up to 24 bytes either side of offset, with a » marking
// it.
func excerpt(b []byte, offset int) string {
	offset = min(max(offset, 0), len(b))
	from, to := max(0, offset-24), min(len(b), offset+24)
	return fmt.Sprintf("%q", string(b[from:offset])+"»"+string(b[offset:to]))
}
