package pgstore

import (
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"
)

const mask = "xxxxx"

// isSecretKey reports whether a connection parameter holds a secret.
func isSecretKey(k string) bool { return k == "password" || k == "sslpassword" }

// RedactDSN returns dsn with every password masked, for messages and logs.
// It understands both forms PostgreSQL accepts: a URL
// (postgres://user:password@host/db?sslpassword=…) and key=value pairs
// (host=h password='it”s' …). A DSN it cannot make sense of is masked
// generously rather than passed through.
func RedactDSN(dsn string) string {
	if rest, prefix, ok := cutURLPrefix(dsn); ok {
		return prefix + redactURL(rest)
	}
	return redactKV(dsn)
}

func cutURLPrefix(dsn string) (rest, prefix string, ok bool) {
	for _, p := range []string{"postgresql://", "postgres://"} {
		if r, ok := strings.CutPrefix(dsn, p); ok {
			return r, p, true
		}
	}
	return dsn, "", false
}

// redactURL masks the password of the userinfo (everything before the last
// '@' ahead of the query, so that a password holding '/' or '@' is masked
// whole) and the values of password and sslpassword in the query.
func redactURL(rest string) string {
	head, query, hasQuery := strings.Cut(rest, "?")
	if at := strings.LastIndex(head, "@"); at >= 0 {
		user, _, hasPW := strings.Cut(head[:at], ":")
		if hasPW {
			head = user + ":" + mask + head[at:]
		}
	}
	if !hasQuery {
		return head
	}
	pairs := strings.Split(query, "&")
	for i, p := range pairs {
		k, _, _ := strings.Cut(p, "=")
		if dk, err := url.QueryUnescape(k); err == nil {
			k = dk
		}
		if isSecretKey(k) {
			pairs[i] = k + "=" + mask
		}
	}
	return head + "?" + strings.Join(pairs, "&")
}

// kvPair is one key=value pair of a DSN as written.
type kvPair struct {
	key, value string // value unquoted
	raw        string // the pair as written
}

// splitKV splits a key=value DSN the way libpq reads it: pairs separated
// by spaces, spaces allowed around '=', a value either single-quoted
// (with \' and \\ escapes) or running to the next space (with
// backslash escapes). ok is false when dsn does not follow that grammar.
func splitKV(dsn string) (pairs []kvPair, ok bool) {
	i := 0
	for {
		for i < len(dsn) && isSpace(dsn[i]) {
			i++
		}
		if i == len(dsn) {
			return pairs, true
		}
		start := i
		for i < len(dsn) && dsn[i] != '=' && !isSpace(dsn[i]) {
			i++
		}
		key := dsn[start:i]
		for i < len(dsn) && isSpace(dsn[i]) {
			i++
		}
		if i == len(dsn) || dsn[i] != '=' || key == "" {
			return pairs, false
		}
		i++
		for i < len(dsn) && isSpace(dsn[i]) {
			i++
		}
		var val strings.Builder
		if i < len(dsn) && dsn[i] == '\'' {
			i++
			closed := false
			for i < len(dsn) {
				c := dsn[i]
				if c == '\\' && i+1 < len(dsn) {
					val.WriteByte(dsn[i+1])
					i += 2
					continue
				}
				i++
				if c == '\'' {
					closed = true
					break
				}
				val.WriteByte(c)
			}
			if !closed {
				return pairs, false
			}
		} else {
			for i < len(dsn) && !isSpace(dsn[i]) {
				c := dsn[i]
				if c == '\\' && i+1 < len(dsn) {
					val.WriteByte(dsn[i+1])
					i += 2
					continue
				}
				val.WriteByte(c)
				i++
			}
		}
		pairs = append(pairs, kvPair{key: key, value: val.String(), raw: dsn[start:i]})
	}
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

func redactKV(dsn string) string {
	pairs, ok := splitKV(dsn)
	if !ok {
		// Not a DSN anyone could parse: mask whatever follows a password
		// key, and a userinfo password, as far as it may run.
		out := dsn
		for _, k := range []string{"sslpassword", "password"} {
			out = maskAfter(out, k)
		}
		if at := strings.LastIndex(out, "@"); at >= 0 {
			if colon := strings.LastIndex(out[:at], ":"); colon >= 0 {
				out = out[:colon+1] + mask + out[at:]
			}
		}
		return out
	}
	parts := make([]string, len(pairs))
	for i, p := range pairs {
		parts[i] = p.raw
		if isSecretKey(p.key) {
			parts[i] = p.key + "=" + mask
		}
	}
	return strings.Join(parts, " ")
}

// maskAfter masks, in a string that does not parse, everything from each
// "key" followed by '=' up to the next space.
func maskAfter(s, key string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, key)
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		j := i + len(key)
		for j < len(s) && isSpace(s[j]) {
			j++
		}
		if j >= len(s) || s[j] != '=' {
			b.WriteString(s[:i+len(key)])
			s = s[i+len(key):]
			continue
		}
		b.WriteString(s[:j+1] + mask)
		k := j + 1
		for k < len(s) && !isSpace(s[k]) {
			k++
		}
		s = s[k:]
	}
}

// secrets lists the passwords a DSN holds, as written and decoded, so
// that scrub can take them out of any message.
func secrets(dsn string) []string {
	var out []string
	add := func(v string) {
		if v != "" {
			out = append(out, v)
			if d, err := url.PathUnescape(v); err == nil && d != v && d != "" {
				out = append(out, d)
			}
			if d, err := url.QueryUnescape(v); err == nil && d != v && d != "" {
				out = append(out, d)
			}
		}
	}
	if rest, _, ok := cutURLPrefix(dsn); ok {
		head, query, _ := strings.Cut(rest, "?")
		if at := strings.LastIndex(head, "@"); at >= 0 {
			if _, pw, ok := strings.Cut(head[:at], ":"); ok {
				add(pw)
			}
		}
		for _, p := range strings.Split(query, "&") {
			k, v, _ := strings.Cut(p, "=")
			if dk, err := url.QueryUnescape(k); err == nil {
				k = dk
			}
			if isSecretKey(k) {
				add(v)
			}
		}
		return out
	}
	if pairs, ok := splitKV(dsn); ok {
		for _, p := range pairs {
			if isSecretKey(p.key) {
				add(p.value)
				add(strings.TrimPrefix(p.raw, p.key+"="))
			}
		}
		return out
	}
	// Unparseable: whatever follows password= up to a space.
	for _, k := range []string{"password"} {
		s := dsn
		for {
			i := strings.Index(s, k+"=")
			if i < 0 {
				break
			}
			s = s[i+len(k)+1:]
			end := strings.IndexFunc(s, func(r rune) bool { return r < 128 && isSpace(byte(r)) })
			if end < 0 {
				end = len(s)
			}
			add(strings.Trim(s[:end], "'"))
			add(s[:end])
		}
	}
	return out
}

// scrub takes every password of dsn out of msg.
func scrub(dsn, msg string) string {
	for _, sec := range secrets(dsn) {
		msg = strings.ReplaceAll(msg, sec, mask)
	}
	return msg
}

// RedactError is err's message on one line, with the password of dsn,
// should the message hold it, masked: for an error of a connection made
// with dsn, shown beside RedactDSN(dsn).
func RedactError(err error, dsn string) string {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	if cfg, perr := pgx.ParseConfig(dsn); perr == nil && cfg.Password != "" {
		msg = strings.ReplaceAll(msg, cfg.Password, mask)
	}
	return msg
}
