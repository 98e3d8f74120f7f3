package conformance

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// sseEvent is an event a test read from a fake's stream.
type sseEvent struct{ Type, Data string }

// sseReader reads a fake's stream event by event, as the client sees it.
type sseReader struct {
	r *bufio.Reader
}

// next reads the next event; io.EOF at a clean end of the body, another
// error when the body broke.
func (s *sseReader) next() (sseEvent, error) {
	var ev sseEvent
	var data []string
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			if err == io.EOF && line != "" {
				err = io.ErrUnexpectedEOF
			}
			return ev, err
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if data != nil {
				ev.Data = strings.Join(data, "\n")
				return ev, nil
			}
		case strings.HasPrefix(line, "event: "):
			ev.Type = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = append(data, strings.TrimPrefix(line, "data: "))
		}
	}
}

// all reads the rest of the events, and how the body ended (io.EOF: a
// clean end).
func (s *sseReader) all() ([]sseEvent, error) {
	var out []sseEvent
	for {
		ev, err := s.next()
		if err != nil {
			return out, err
		}
		out = append(out, ev)
	}
}

// post sends body to url with headers and returns the response; the
// request gives up after a minute, so that a fake that never answers
// fails the test rather than hanging it.
func post(t *testing.T, url string, headers map[string]string, body string) *http.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func stream(t *testing.T, resp *http.Response) *sseReader {
	t.Helper()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("content-type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%d %s: %s", resp.StatusCode, resp.Header.Get("content-type"), b)
	}
	return &sseReader{r: bufio.NewReader(resp.Body)}
}

func decodeJSON(t *testing.T, s string, v any) {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader([]byte(s)))
	if err := d.Decode(v); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
}

func TestPiecesSplitsByRunes(t *testing.T) {
	got := pieces("héllo wörld", 4)
	if strings.Join(got, "|") != "héll|o wö|rld" {
		t.Fatalf("%q", got)
	}
	if pieces("", 4) != nil {
		t.Fatal("pieces of nothing")
	}
}
