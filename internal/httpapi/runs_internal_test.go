package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// sliceStore serves one session's Runs from a slice and records the
// reads.
type sliceStore struct {
	Store // nil: only SessionRuns is called

	mu       sync.Mutex
	runs     []runtime.SessionRun
	reads    int
	maxRead  int      // the most Runs one read returned
	failRead int      // the read (from 1) that fails; 0: none
	limited  []string // what OnLimit heard: "limit tenant"
}

func (s *sliceStore) SessionRuns(_ context.Context, _, _ string, after int64, limit int) ([]runtime.SessionRun, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	if s.reads == s.failRead {
		return nil, errors.New("dial tcp 10.0.0.7:5432: connect: connection refused")
	}
	var out []runtime.SessionRun
	for _, sr := range s.runs {
		if sr.Ordinal > after && (limit <= 0 || len(out) < limit) {
			out = append(out, sr)
		}
	}
	s.maxRead = max(s.maxRead, len(out))
	return out, nil
}

// pageServer serves writeRunList with a byte bound of maxBytes on
// 127.0.0.1, over a store it can make fail.
func pageServer(t *testing.T, st *sliceStore, maxBytes int) *httptest.Server {
	t.Helper()
	s := &Server{cfg: Config{Store: st, OnLimit: func(limit, tenant string) {
		st.mu.Lock()
		defer st.mu.Unlock()
		st.limited = append(st.limited, limit+" "+tenant)
	}}, log: slog.New(slog.DiscardHandler)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sessions/{id}/runs", func(w http.ResponseWriter, r *http.Request) {
		after, err := queryInt(r, "after", 0, 0, 1<<62)
		if err == nil {
			var limit int64
			if limit, err = queryInt(r, "limit", defaultPageLimit, 1, maxPageLimit); err == nil {
				err = s.writeRunList(w, r, "acme", r.PathValue("id"), after, int(limit), maxBytes)
			}
		}
		if err != nil {
			var ae *apiError
			if !errors.As(err, &ae) {
				ae = s.unavailableOrInternal(r, err)
			}
			writeAPIError(w, ae)
		}
	})
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return ts
}

func sessionOf(n int) []runtime.SessionRun {
	out := make([]runtime.SessionRun, n)
	for i := range out {
		out[i] = runtime.SessionRun{Ordinal: int64(i + 1), Run: loop.Run{Status: loop.StatusCompleted, Spec: loop.Spec{
			ID: fmt.Sprintf("run_%04d", i+1), Tenant: "acme", Session: "s1",
			Input: strings.Repeat("x", 10_000), Metadata: json.RawMessage(`{"pad": "` + strings.Repeat("y", 10_000) + `"}`),
		}}}
	}
	return out
}

func getPage(t *testing.T, ts *httptest.Server, query string) (RunListJSON, int, int) {
	t.Helper()
	resp, err := ts.Client().Get(ts.URL + "/v1/sessions/s1/runs" + query)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var page RunListJSON
	if resp.StatusCode == http.StatusOK {
		require.NoError(t, json.Unmarshal(body, &page), "body: %s", body)
	}
	return page, len(body), resp.StatusCode
}

// A page cut by its byte bound ends with next_after, and paging on gives
// every Run once; the store is read a chunk at a time.
func TestRunListPagesAreCutByBytes(t *testing.T) {
	st := &sliceStore{runs: sessionOf(300)}
	ts := pageServer(t, st, 4096)
	var got []int64
	after, pages := int64(0), 0
	for ; ; pages++ {
		require.Less(t, pages, 300, "paging ends")
		page, n, status := getPage(t, ts, fmt.Sprintf("?limit=500&after=%d", after))
		require.Equal(t, http.StatusOK, status)
		require.LessOrEqual(t, n, 4096, "page %d is bounded in bytes", pages)
		require.NotEmpty(t, page.Runs)
		for _, r := range page.Runs {
			got = append(got, r.Ordinal)
		}
		if page.NextAfter == nil {
			break
		}
		require.Equal(t, page.Runs[len(page.Runs)-1].Ordinal, *page.NextAfter)
		after = *page.NextAfter
	}
	require.Greater(t, pages, 10, "the bytes cut the pages, not the count")
	require.Len(t, got, 300)
	for i, o := range got {
		require.Equal(t, int64(i+1), o, "every Run once, in order")
	}
	require.LessOrEqual(t, st.maxRead, pageChunk+1, "a page holds a chunk of whole Runs at most")
	require.Len(t, st.limited, pages, "every page cut by its bytes is counted")
	require.Equal(t, LimitPageBytes+" acme", st.limited[0])

	// A bound below one summary still moves on, a Run a page.
	tiny := pageServer(t, &sliceStore{runs: sessionOf(3)}, 10)
	for after := int64(0); after < 3; after++ {
		page, _, _ := getPage(t, tiny, fmt.Sprintf("?after=%d", after))
		require.Len(t, page.Runs, 1)
		require.Equal(t, after+1, page.Runs[0].Ordinal)
		if after < 2 {
			require.Equal(t, after+1, *page.NextAfter)
		} else {
			require.Nil(t, page.NextAfter)
		}
	}
}

// A store that fails once a page is on its way ends the page early, with
// next_after, as whole JSON; the next page answers the error.
func TestRunListEndsEarlyOnAStoreError(t *testing.T) {
	st := &sliceStore{runs: sessionOf(200), failRead: 2}
	ts := pageServer(t, st, DefaultMaxPageBytes)
	page, _, status := getPage(t, ts, "?limit=500")
	require.Equal(t, http.StatusOK, status)
	require.Len(t, page.Runs, pageChunk)
	require.NotNil(t, page.NextAfter)
	require.Equal(t, int64(pageChunk), *page.NextAfter)

	st.mu.Lock()
	st.failRead = st.reads + 1
	st.mu.Unlock()
	_, _, status = getPage(t, ts, fmt.Sprintf("?limit=500&after=%d", *page.NextAfter))
	require.Equal(t, http.StatusInternalServerError, status)
}
