package chaos

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/loop"
)

// The clients follow each Run on its event stream (GET
// /v1/runs/{id}/events, Server-Sent Events) through a node other than the
// one that acknowledged it, and resume it on another node with
// Last-Event-ID when a fault cuts it off. Every stream must go on from
// the event after Last-Event-ID, none missing or repeated, whichever node
// serves it; and after the run, what the streams delivered must be the
// store's log (chaosCheckStreams).

const (
	// chaosStreamIdle: a stream that sent nothing for this long, not even
	// the heartbeat a node sends every 15 s, is given up: its node is
	// paused or gone.
	chaosStreamIdle = 20 * time.Second
	// chaosStreamStale: a stream that has not delivered, for this long,
	// events the Run already has (a look at it shows a later Seq) is given
	// up and resumed elsewhere. A node re-reads the log every second when
	// no news comes, so a healthy stream is never that late.
	chaosStreamStale = 5 * time.Second
	// chaosStepEvery: a followed Run is looked at (GET) at least this
	// often, besides after each of its events, for what it waits on.
	chaosStepEvery = 2 * time.Second
)

// runStream is what the event streams of one Run delivered: the type of
// each event by Seq (types[seq-1]). One client follows a Run at a time.
type runStream struct {
	types []loop.EventType
	ended bool // its terminal event came
}

func (s *runStream) last() int64 { return int64(len(s.types)) }

func (c *chaosClients) streamOf(runID string) *runStream {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.streams[runID]
	if st == nil {
		st = &runStream{}
		c.streams[runID] = st
	}
	return st
}

// sseEvent is one event of a stream: its ID (the Seq) and type.
type sseEvent struct {
	seq int64
	typ loop.EventType
}

// follow follows a Run's event stream until its terminal event, on a
// node other than the one that acknowledged it, answering its approvals
// and questions (step) and cancelling it (kind cancel) while it runs,
// until bound passes or the chaos phase is over; the drain takes over
// from there.
func (c *chaosClients) follow(r ackedRun, rng *rand.Rand, bound time.Duration) {
	deadline := time.Now().Add(bound)
	st := c.streamOf(r.ID)
	cancelled := false
	for !st.ended && !c.stopping.Load() && time.Now().Before(deadline) {
		i := c.pick(r.Node, nil)
		if i < 0 {
			c.failed() // no node runs: a request no node can serve
		} else if c.followOn(i, r, st, rng, deadline, &cancelled) {
			return
		}
		time.Sleep(retryPause) // before the stream goes on elsewhere
	}
}

// followOn follows the stream on node i from where st left off. It
// returns true when the follow is over (the Run ended, the chaos phase
// did, or bound passed), false when the stream should go on elsewhere.
func (c *chaosClients) followOn(i int, r ackedRun, st *runStream, rng *rand.Rand, deadline time.Time, cancelled *bool) bool {
	addr := c.nodes[i].addr()
	if addr == "" {
		return false
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/v1/runs/"+r.ID+"/events", nil)
	if err != nil {
		c.violation("event stream of run %s/%s: %v", r.Tenant, r.ID, err)
		return true
	}
	req.Header.Set("Authorization", "Bearer "+r.Token)
	req.Header.Set("Accept", "text/event-stream")
	if n := st.last(); n > 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatInt(n, 10))
	}
	resp, err := c.stream.Do(req)
	if err != nil {
		c.note(i, 0, err)
		return false
	}
	defer resp.Body.Close()
	c.note(i, resp.StatusCode, nil)
	switch {
	case resp.StatusCode == http.StatusOK:
	case resp.StatusCode >= 500:
		return false
	default:
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		c.violationOnce("stream "+r.ID, "the event stream of run %s/%s, acknowledged by node %d, answered %d on node %d: %s",
			r.Tenant, r.ID, r.Node, resp.StatusCode, i, truncateBytes(raw, 200))
		return true
	}
	c.streamsOpened.Add(1)
	if i != r.Node {
		c.streamsCrossNode.Add(1)
	}
	items := make(chan sseEvent, 16)
	var lastByte atomic.Int64
	lastByte.Store(time.Now().UnixNano())
	go readSSE(ctx, resp.Body, items, &lastByte)

	tick := time.NewTicker(150 * time.Millisecond)
	defer tick.Stop()
	lastEvent, lastStep, needStep := time.Now(), time.Time{}, true
	for {
		select {
		case ev, ok := <-items:
			if !ok {
				// Cut off before the Run's end: the node stopped, or lost
				// its store for a moment.
				c.streamsBroken.Add(1)
				c.failed()
				return false
			}
			lastEvent, needStep = time.Now(), true
			if c.gotEvent(r, i, st, ev) {
				return true
			}
		case <-tick.C:
			now := time.Now()
			if c.stopping.Load() || now.After(deadline) {
				return true
			}
			if needStep || now.Sub(lastStep) >= chaosStepEvery {
				needStep, lastStep = false, now
				run, ok := c.step(r, rng)
				if ok && r.Kind == "cancel" && !*cancelled && !run.Status.Terminal() && run.Waiting != nil && len(run.Waiting.Pending) > 0 {
					*cancelled = c.cancel(r)
				}
				if ok && run.Seq > st.last() && now.Sub(lastEvent) >= chaosStreamStale {
					c.streamsStale.Add(1)
					return false
				}
			}
			if now.Sub(time.Unix(0, lastByte.Load())) >= chaosStreamIdle {
				c.streamsIdle.Add(1)
				return false
			}
		}
	}
}

// gotEvent records an event a stream on node i delivered; it reports
// whether it was the Run's terminal event.
func (c *chaosClients) gotEvent(r ackedRun, i int, st *runStream, ev sseEvent) bool {
	c.streamEvents.Add(1)
	last := st.last()
	if ev.seq != last+1 {
		c.violationOnce("seq "+r.ID, "the event stream of run %s/%s on node %d sent event %d (%s) after event %d: a stream goes on from the event after Last-Event-ID, none missing or repeated",
			r.Tenant, r.ID, i, ev.seq, ev.typ, last)
		if ev.seq <= last {
			return false
		}
		for st.last() < ev.seq-1 {
			st.types = append(st.types, "") // missed: compared with nothing
		}
	}
	st.types = append(st.types, ev.typ)
	if (loop.Event{Type: ev.typ}).Terminal() {
		st.ended = true
	}
	return st.ended
}

// readSSE reads a stream's events into items until the stream ends (then
// it closes items) or ctx does, and stamps lastByte at every line,
// heartbeats included.
func readSSE(ctx context.Context, body io.Reader, items chan<- sseEvent, lastByte *atomic.Int64) {
	defer close(items)
	br := bufio.NewReaderSize(body, 64*1024)
	var ev sseEvent
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		lastByte.Store(time.Now().UnixNano())
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if ev.seq > 0 {
				select {
				case items <- ev:
				case <-ctx.Done():
					return
				}
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, "id:"):
			ev.seq, _ = strconv.ParseInt(strings.TrimSpace(line[len("id:"):]), 10, 64)
		case strings.HasPrefix(line, "event:"):
			ev.typ = loop.EventType(strings.TrimSpace(line[len("event:"):]))
		}
	}
}

// chaosCheckStream compares what a Run's event streams delivered with its
// log in the store: the same event type at every Seq the streams
// delivered.
func chaosCheckStream(st *runStream, evs []loop.Event) []string {
	if st == nil {
		return nil
	}
	for k, typ := range st.types {
		seq := int64(k + 1)
		switch {
		case typ == "":
		case k >= len(evs):
			return []string{fmt.Sprintf("its event stream delivered event %d (%s), but its log in the store has %d events", seq, typ, len(evs))}
		case evs[k].Seq != seq || evs[k].Type != typ:
			return []string{fmt.Sprintf("its event stream delivered event %d as %s, but the store holds %s at %d", seq, typ, evs[k].Type, evs[k].Seq)}
		}
	}
	return nil
}
