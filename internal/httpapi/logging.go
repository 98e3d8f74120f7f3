package httpapi

import (
	"context"
	"crypto/rand"
	"log/slog"
	"net/http"
	"time"
)

// RequestIDHeader names the request's ID on every response. A client may
// send its own (1 to 128 characters of A-Z, a-z, 0-9, '.', '_', ':' and
// '-', such as a UUID); otherwise, or when it sends anything else, the
// server makes one. Error bodies carry it as error.request_id, and the
// server's log line of the request as request_id.
const RequestIDHeader = "X-Request-ID"

// maxRequestID bounds a client's X-Request-ID.
const maxRequestID = 128

// requestInfo is what the log record of a request gathers on the way.
type requestInfo struct {
	requestID string
	tenant    string
	// detail is the error behind the answer, for the log only: tenants
	// see the API's own message.
	detail string
}

type infoKey struct{}

func infoOf(ctx context.Context) *requestInfo {
	info, _ := ctx.Value(infoKey{}).(*requestInfo)
	return info
}

// requestIDOf returns the request's ID ("" outside logRequests).
func requestIDOf(r *http.Request) string {
	if info := infoOf(r.Context()); info != nil {
		return info.requestID
	}
	return ""
}

// noteDetail keeps err for the request's log line.
func noteDetail(r *http.Request, err error) {
	if info := infoOf(r.Context()); info != nil && err != nil {
		info.detail = err.Error()
	}
}

// requestID returns the client's X-Request-ID when it is a sane token, and
// a fresh random one otherwise.
func requestID(r *http.Request) string {
	if id := r.Header.Get(RequestIDHeader); saneRequestID(id) {
		return id
	}
	return rand.Text()
}

func saneRequestID(id string) bool {
	if id == "" || len(id) > maxRequestID {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}

// responseRequestID returns the X-Request-ID already set on w, setting a
// fresh one if there is none (an answer written outside logRequests).
func responseRequestID(w http.ResponseWriter) string {
	id := w.Header().Get(RequestIDHeader)
	if id == "" {
		id = rand.Text()
		w.Header().Set(RequestIDHeader, id)
	}
	return id
}

// statusWriter records the status a handler wrote. It unwraps for
// http.ResponseController, so event streams can still flush.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// logRequests gives every request its ID (the X-Request-ID of the
// response) and its span (trace.go), and logs it once it is answered:
// request ID, method, path, status, duration, tenant, bytes, and the
// error behind a failure. Probes and scrapes log at debug, the API at
// info.
func (s *Server) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		began := time.Now()
		info := &requestInfo{requestID: requestID(r)}
		w.Header().Set(RequestIDHeader, info.requestID)
		sw := &statusWriter{ResponseWriter: w}
		ctx, span := startRequestSpan(r)
		inner := r.WithContext(context.WithValue(ctx, infoKey{}, info))
		next.ServeHTTP(sw, inner)
		level := slog.LevelInfo
		switch r.URL.Path {
		case "/healthz", "/readyz", "/metrics":
			level = slog.LevelDebug
		}
		if sw.status == 0 {
			sw.status = http.StatusOK
		}
		endRequestSpan(span, inner, sw.status, info)
		attrs := []slog.Attr{
			slog.String("request_id", info.requestID),
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Int("status", sw.status),
			slog.Duration("duration", time.Since(began)), slog.String("tenant", info.tenant), slog.Int64("bytes", sw.bytes),
		}
		if info.detail != "" {
			attrs = append(attrs, slog.String("error", info.detail))
		}
		s.log.LogAttrs(r.Context(), level, "http request", attrs...)
	})
}
