package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"time"
)

// requestInfo is what the log record of a request gathers on the way.
type requestInfo struct {
	tenant string
}

type infoKey struct{}

func infoOf(ctx context.Context) *requestInfo {
	info, _ := ctx.Value(infoKey{}).(*requestInfo)
	return info
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

// logRequests logs every request once it is answered: method, path,
// status, duration and tenant. Probes and scrapes log at debug, the API
// at info.
func (s *Server) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		began := time.Now()
		info := &requestInfo{}
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), infoKey{}, info)))
		level := slog.LevelInfo
		switch r.URL.Path {
		case "/healthz", "/readyz", "/metrics":
			level = slog.LevelDebug
		}
		if sw.status == 0 {
			sw.status = http.StatusOK
		}
		s.log.LogAttrs(r.Context(), level, "http request",
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Int("status", sw.status),
			slog.Duration("duration", time.Since(began)), slog.String("tenant", info.tenant), slog.Int64("bytes", sw.bytes))
	})
}
