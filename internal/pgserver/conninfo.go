package pgserver

import (
	"fmt"
	"net/url"
	"strings"
)

// A DSN is either a libpq keyword/value string ("host=/tmp/x port=5432
// dbname=postgres") or a URL ("postgres://user@host/db"). withDatabase
// returns dsn naming database instead: for a keyword/value string it
// replaces or adds dbname; for a URL it replaces the path.
func withDatabase(dsn, database string) (string, error) {
	if isURL(dsn) {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("pgserver: DSN %q is not a valid URL: %w", dsn, err)
		}
		u.Path, u.RawPath = "/"+database, ""
		return u.String(), nil
	}
	pairs, err := parseConninfo(dsn)
	if err != nil {
		return "", err
	}
	found := false
	for i := range pairs {
		if pairs[i].key == "dbname" {
			pairs[i].value, found = database, true
		}
	}
	if !found {
		pairs = append(pairs, keyValue{"dbname", database})
	}
	return formatConninfo(pairs), nil
}

func isURL(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

type keyValue struct{ key, value string }

// parseConninfo splits a libpq keyword/value connection string: pairs
// separated by whitespace, "key = value" with optional spaces around "=",
// a value either single-quoted or bare, a backslash escaping the next
// character in both.
func parseConninfo(s string) ([]keyValue, error) {
	var pairs []keyValue
	i := 0
	skipSpace := func() {
		for i < len(s) && isSpace(s[i]) {
			i++
		}
	}
	for {
		skipSpace()
		if i == len(s) {
			return pairs, nil
		}
		start := i
		for i < len(s) && s[i] != '=' && !isSpace(s[i]) {
			i++
		}
		key := s[start:i]
		skipSpace()
		if i == len(s) || s[i] != '=' {
			return nil, fmt.Errorf("pgserver: connection string %q: %q is not followed by \"=\"", s, key)
		}
		i++
		skipSpace()
		var value strings.Builder
		if i < len(s) && s[i] == '\'' {
			i++
			for {
				if i == len(s) {
					return nil, fmt.Errorf("pgserver: connection string %q: unterminated quoted value of %q", s, key)
				}
				c := s[i]
				i++
				if c == '\'' {
					break
				}
				if c == '\\' && i < len(s) {
					c = s[i]
					i++
				}
				value.WriteByte(c)
			}
		} else {
			for i < len(s) && !isSpace(s[i]) {
				c := s[i]
				i++
				if c == '\\' && i < len(s) {
					c = s[i]
					i++
				}
				value.WriteByte(c)
			}
		}
		pairs = append(pairs, keyValue{key, value.String()})
	}
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

func formatConninfo(pairs []keyValue) string {
	parts := make([]string, len(pairs))
	for i, p := range pairs {
		parts[i] = p.key + "=" + quoteConninfo(p.value)
	}
	return strings.Join(parts, " ")
}

// quoteConninfo is v as a conninfo value: bare when it can be, else
// single-quoted with \ and ' escaped.
func quoteConninfo(v string) string {
	if v != "" && !strings.ContainsAny(v, " \t\n\r\f\v'\\") {
		return v
	}
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}
