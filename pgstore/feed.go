package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agenthost/agenthost/runtime"
)

// The change feed (runtime.ChangeFeed) tells the other Store instances on
// the database which Runs were created or committed to, through
// LISTEN/NOTIFY on one channel. It is a latency hint: nothing depends on
// a notification arriving.
const (
	notifyChannel = "agenthost_changes"
	// notifyLimit bounds one payload, under PostgreSQL's 8000 bytes.
	notifyLimit = 7900
	// coalesceWindow is how long the notifier gathers changes before it
	// sends them: a Run committed to several times in it is sent once.
	coalesceWindow = 5 * time.Millisecond
	// maxPending bounds the Runs waiting to be sent; past it a change is
	// dropped and the others are told to rescan.
	maxPending = 10_000
	// maxSubQueue bounds the changes waiting for one subscriber; past it
	// they are replaced by one Rescan.
	maxSubQueue = 10_000
	// listenCheck is how long the listener waits for a notification
	// before it checks its connection with a ping.
	listenCheck = 30 * time.Second
	// backoffMin and backoffMax bound the pause between reconnections.
	backoffMin = 100 * time.Millisecond
	backoffMax = 3 * time.Second
	// heartbeat is how often an instance says "here" to the others on its
	// schema, and peerTTL how long one it has not heard from since counts
	// as listening (audience).
	heartbeat = 30 * time.Second
	peerTTL   = 3 * heartbeat
	// joinGrace is how long, after its listener begins to listen, an
	// instance sends its changes whatever it knows of the others: the time
	// for their answers to its hello to come.
	joinGrace = 2 * time.Second
)

// notice is one notification's payload. Changes are arrays
// [tenant, session, run, seq, owner], to keep payloads small. Hello says
// the sender has just begun to listen, and asks every other instance on
// the schema to answer Here; Here says the sender listens (an answer, or
// the heartbeat), and Skipped, on a Here that answers a Hello, that it had
// dropped changes for want of an audience since its last such answer,
// which a newcomer makes up for with a Rescan.
type notice struct {
	Origin  string            `json:"o"`
	Schema  string            `json:"s"`
	Rescan  bool              `json:"r,omitempty"`
	Changes []json.RawMessage `json:"c,omitempty"`
	Hello   bool              `json:"h,omitempty"`
	Here    bool              `json:"p,omitempty"`
	Skipped bool              `json:"k,omitempty"`
}

type runKey struct{ tenant, run string }

// feed is the change feed of one Store instance: a notifier goroutine
// that sends this instance's changes, coalesced, on one dedicated
// connection, and a listener goroutine that receives the others' on
// another and hands them to the subscribers.
type feed struct {
	s      *Store
	origin string // unique to this instance: the listener drops its own
	schema string // the listener drops other schemas' changes

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// mu guards the changes waiting to be sent and what the feed knows of
	// its audience: the other instances listening on its schema. The
	// notifier sends changes only while one may hear them (audience).
	mu        sync.Mutex
	pending   map[runKey]runtime.Change
	overflow  bool // a change was dropped: send a rescan
	wake      chan struct{}
	peers     map[string]time.Time // another instance's origin → when its last notice came
	listening bool                 // the listener holds a LISTEN now
	joinedAt  time.Time            // when it last began to listen
	sayHello  bool                 // the notifier owes a Hello
	sayHere   bool                 // the notifier owes a Here
	skipped   bool                 // changes were dropped since the last Here that answered a Hello

	subMu   sync.Mutex
	subs    map[uint64]*subscription
	nextSub uint64
	closed  bool
}

// startFeed connects the listener (so that a subscriber hears every change
// made after Open returns) and starts both goroutines. The notifier
// connects when it first has something to send.
func startFeed(ctx context.Context, s *Store) (*feed, error) {
	var id [8]byte
	_, _ = rand.Read(id[:])
	f := &feed{s: s, origin: hex.EncodeToString(id[:]), schema: s.opts.Schema,
		pending: map[runKey]runtime.Change{}, wake: make(chan struct{}, 1), subs: map[uint64]*subscription{},
		peers: map[string]time.Time{}}
	conn, err := f.listenConn(ctx)
	if err != nil {
		return nil, err
	}
	f.joined()
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.wg.Add(2)
	go f.listen(conn)
	go f.notify()
	return f, nil
}

func (f *feed) connect(ctx context.Context) (*pgx.Conn, error) {
	return pgx.ConnectConfig(ctx, f.s.connCf.Copy())
}

func (f *feed) listenConn(ctx context.Context) (*pgx.Conn, error) {
	conn, err := f.connect(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		closeConn(conn)
		return nil, err
	}
	return conn, nil
}

// closeConn closes a feed connection, waiting a second at most for a
// server that does not answer.
func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// close stops both goroutines, after the notifier sent what was queued,
// and ends every subscription.
func (f *feed) close() {
	f.cancel()
	f.wg.Wait()
	f.subMu.Lock()
	f.closed = true
	subs := f.subs
	f.subs = nil
	f.subMu.Unlock()
	for _, sub := range subs {
		sub.stop()
	}
}

// publish queues a change for the other instances. It never blocks: a
// Run already queued keeps its newest Seq, and past maxPending Runs the
// change is dropped and a rescan sent instead.
func (f *feed) publish(c runtime.Change) {
	if f == nil {
		return
	}
	k := runKey{c.Tenant, c.RunID}
	f.mu.Lock()
	if old, ok := f.pending[k]; ok {
		if c.Seq >= old.Seq {
			f.pending[k] = c
		}
	} else if len(f.pending) >= maxPending {
		f.overflow = true
	} else {
		f.pending[k] = c
	}
	f.mu.Unlock()
	f.poke()
}

// joined records that the listener has begun to listen (again), and
// has the notifier say Hello.
func (f *feed) joined() {
	f.mu.Lock()
	f.listening, f.joinedAt, f.sayHello = true, time.Now(), true
	f.mu.Unlock()
	f.poke()
}

// left records that the listener lost its LISTEN: until it listens again,
// the feed cannot tell who else does, and sends its changes.
func (f *feed) left() {
	f.mu.Lock()
	f.listening = false
	f.mu.Unlock()
}

// heard records a notice of another instance on the schema; a Hello
// makes the notifier answer Here. It reports whether this instance is a
// newcomer: its listener began to listen less than peerTTL ago.
func (f *feed) heard(n notice) (newcomer bool) {
	f.mu.Lock()
	now := time.Now()
	f.peers[n.Origin] = now
	if n.Hello {
		f.sayHere = true
	}
	newcomer = now.Sub(f.joinedAt) < peerTTL
	f.mu.Unlock()
	if n.Hello {
		f.poke()
	}
	return newcomer
}

// audienceLocked reports whether another instance may hear a change now:
// one was heard from within peerTTL, or the feed cannot tell (its listener
// is not listening, or began less than joinGrace ago). The caller holds mu.
func (f *feed) audienceLocked(now time.Time) bool {
	if !f.listening || now.Sub(f.joinedAt) < joinGrace {
		return true
	}
	for origin, at := range f.peers {
		if now.Sub(at) < peerTTL {
			return true
		}
		delete(f.peers, origin)
	}
	return false
}

// poke wakes the notifier.
func (f *feed) poke() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// requeue puts back changes a failed send took, unless newer ones of
// their Runs came meanwhile.
func (f *feed) requeue(changes []runtime.Change, rescan bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.overflow = f.overflow || rescan
	for _, c := range changes {
		k := runKey{c.Tenant, c.RunID}
		if old, ok := f.pending[k]; ok {
			if c.Seq > old.Seq {
				f.pending[k] = c
			}
		} else if len(f.pending) >= maxPending {
			f.overflow = true
		} else {
			f.pending[k] = c
		}
	}
}

// outgoing is what one send of the notifier carries: changes, a rescan,
// a Hello, a Here (answer: owed to a Hello, not only the heartbeat's), and
// whether that Here says changes were dropped.
type outgoing struct {
	changes                              []runtime.Change
	rescan, hello, here, answer, skipped bool
}

func (o outgoing) empty() bool { return len(o.changes) == 0 && !o.rescan && !o.hello && !o.here }

// take empties the queue and the announcements owed, and adds a Here
// when beat is set (the heartbeat). With no audience (audienceLocked) it
// drops the changes, and the next Here that answers a Hello says so.
func (f *feed) take(beat bool) outgoing {
	f.mu.Lock()
	defer f.mu.Unlock()
	answer := f.sayHere
	o := outgoing{hello: f.sayHello, here: answer || beat, answer: answer}
	f.sayHello, f.sayHere = false, false
	if f.audienceLocked(time.Now()) {
		for _, c := range f.pending {
			o.changes = append(o.changes, c)
		}
		o.rescan, f.overflow = f.overflow, false
	} else if len(f.pending) > 0 || f.overflow {
		f.skipped = true
		f.overflow = false
	}
	clear(f.pending)
	if answer {
		o.skipped, f.skipped = f.skipped, false
	}
	return o
}

// notify is the notifier goroutine: woken by publish, it waits
// coalesceWindow for more, then sends everything queued in one batch of
// pg_notify calls (one round trip, one implicit transaction). When it
// cannot send, it keeps the changes and tries again after a jittered,
// growing pause.
func (f *feed) notify() {
	defer f.wg.Done()
	var (
		conn    *pgx.Conn
		backoff = backoffMin
	)
	defer func() {
		if conn != nil {
			closeConn(conn)
		}
	}()
	// try sends the payloads on conn, connecting it first if need be. The
	// notifier's transactions commit asynchronously: a notification is a
	// hint, and losing one in a crash of the server costs nothing, so
	// none of them waits for the WAL to reach the disk.
	try := func(ctx context.Context, payloads []string) error {
		if conn == nil || conn.IsClosed() {
			cf := f.s.connCf.Copy()
			cf.RuntimeParams["synchronous_commit"] = "off"
			c, err := pgx.ConnectConfig(ctx, cf)
			if err != nil {
				return err
			}
			conn = c
		}
		b := &pgx.Batch{}
		for _, p := range payloads {
			b.Queue("SELECT pg_notify($1, $2)", notifyChannel, p)
		}
		err := conn.SendBatch(ctx, b).Close()
		if err != nil {
			closeConn(conn)
			conn = nil
		}
		return err
	}
	// send sends what is queued, and the announcements owed (take). A
	// connection that was fine and fails now (the server restarted) is
	// replaced at once, once; when sending still fails, the changes go
	// back in the queue, and the announcements are owed again.
	send := func(ctx context.Context, beat bool) error {
		o := f.take(beat)
		if o.empty() {
			return nil
		}
		payloads := encodeAnnouncements(f.origin, f.schema, o.hello, o.here, o.skipped)
		payloads = append(payloads, encodeNotices(f.origin, f.schema, o.rescan, o.changes)...)
		hadConn := conn != nil
		err := try(ctx, payloads)
		if err != nil && hadConn && ctx.Err() == nil {
			err = try(ctx, payloads)
		}
		if err != nil {
			f.requeue(o.changes, o.rescan)
			f.owe(o)
		}
		return err
	}
	beat := time.NewTicker(heartbeat)
	defer beat.Stop()
	for {
		select {
		case <-f.ctx.Done():
			f.finalSend(send)
			return
		case <-beat.C:
			if err := send(f.ctx, true); err != nil && f.ctx.Err() == nil {
				f.s.log.Debug("pgstore: the change feed cannot say it listens", "where", f.s.where, "err", err)
			}
			continue
		case <-f.wake:
		}
		t := time.NewTimer(coalesceWindow)
		select {
		case <-f.ctx.Done():
			t.Stop()
			f.finalSend(send)
			return
		case <-t.C:
		}
		if err := send(f.ctx, false); err != nil {
			if f.ctx.Err() != nil {
				return
			}
			if backoff == backoffMin {
				f.s.log.Warn("pgstore: the change feed cannot notify the other nodes; retrying", "where", f.s.where, "err", err)
			} else {
				f.s.log.Debug("pgstore: the change feed cannot notify the other nodes yet", "where", f.s.where, "err", err)
			}
			if !f.sleep(jitter(backoff)) {
				return
			}
			backoff = min(2*backoff, backoffMax)
			select {
			case f.wake <- struct{}{}:
			default:
			}
			continue
		}
		backoff = backoffMin
	}
}

// finalSend sends what Close found queued, briefly.
func (f *feed) finalSend(send func(context.Context, bool) error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = send(ctx, false)
}

// owe makes the notifier owe again the announcements of a send that
// failed.
func (f *feed) owe(o outgoing) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sayHello = f.sayHello || o.hello
	f.sayHere = f.sayHere || o.answer
	f.skipped = f.skipped || o.skipped
}

// encodeAnnouncements is the payload of a Hello, a Here, or both (none
// when neither).
func encodeAnnouncements(origin, schema string, hello, here, skipped bool) []string {
	if !hello && !here {
		return nil
	}
	b, _ := json.Marshal(notice{Origin: origin, Schema: schema, Hello: hello, Here: here, Skipped: here && skipped})
	return []string{string(b)}
}

// sleep pauses for d, or until the feed closes; it reports whether the
// feed is still open.
func (f *feed) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-f.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// jitter spreads d over [d/2, 3d/2).
func jitter(d time.Duration) time.Duration {
	return d/2 + mrand.N(d)
}

// encodeNotices packs changes into payloads under notifyLimit bytes. A
// rescan goes first, on its own.
func encodeNotices(origin, schema string, rescan bool, changes []runtime.Change) []string {
	var out []string
	head := fmt.Sprintf(`{"o":%q,"s":%q`, origin, schema)
	if rescan {
		out = append(out, head+`,"r":true}`)
	}
	var b strings.Builder
	for _, c := range changes {
		item, err := json.Marshal([]any{c.Tenant, c.Session, c.RunID, c.Seq, c.Owner})
		if err != nil {
			continue
		}
		if b.Len() > 0 && b.Len()+1+len(item)+2 > notifyLimit {
			b.WriteString("]}")
			out = append(out, b.String())
			b.Reset()
		}
		if b.Len() == 0 {
			b.WriteString(head + `,"c":[`)
		} else {
			b.WriteByte(',')
		}
		b.Write(item)
	}
	if b.Len() > 0 {
		b.WriteString("]}")
		out = append(out, b.String())
	}
	return out
}

// decodeNotice reads a payload; ok is false for one that is not ours.
func decodeNotice(payload string) (n notice, changes []runtime.Change, ok bool) {
	if err := json.Unmarshal([]byte(payload), &n); err != nil {
		return n, nil, false
	}
	for _, raw := range n.Changes {
		var (
			c    runtime.Change
			item = []any{&c.Tenant, &c.Session, &c.RunID, &c.Seq, &c.Owner}
		)
		if err := json.Unmarshal(raw, &item); err != nil {
			return n, nil, false
		}
		changes = append(changes, c)
	}
	return n, changes, true
}

// listen is the listener goroutine. It hands the other instances'
// changes to the subscribers. When its connection fails it reconnects
// with a jittered exponential backoff, LISTENs again and delivers a
// Rescan, since changes may have gone by meanwhile.
func (f *feed) listen(conn *pgx.Conn) {
	defer f.wg.Done()
	for {
		err := f.receive(conn)
		closeConn(conn)
		f.left()
		if f.ctx.Err() != nil {
			return
		}
		f.s.log.Warn("pgstore: the change feed lost its connection; reconnecting", "where", f.s.where, "err", err)
		for backoff := backoffMin; ; backoff = min(2*backoff, backoffMax) {
			if !f.sleep(jitter(backoff)) {
				return
			}
			ctx, cancel := context.WithTimeout(f.ctx, f.s.opts.ConnectTimeout)
			conn, err = f.listenConn(ctx)
			cancel()
			if err == nil {
				break
			}
			if f.ctx.Err() != nil {
				return
			}
			f.s.log.Debug("pgstore: the change feed cannot reconnect yet", "where", f.s.where, "err", err)
		}
		f.s.log.Info("pgstore: the change feed reconnected", "where", f.s.where)
		f.joined()
		f.deliver(runtime.Change{Rescan: true})
	}
}

// receive delivers notifications until the connection fails or the feed
// closes. After listenCheck without one it pings the server, so that a
// connection that died silently is noticed.
func (f *feed) receive(conn *pgx.Conn) error {
	for {
		ctx, cancel := context.WithTimeout(f.ctx, listenCheck)
		n, err := conn.WaitForNotification(ctx)
		cancel()
		switch {
		case err == nil:
			f.handle(n.Payload)
			continue
		case f.ctx.Err() != nil:
			return err
		case errors.Is(err, context.DeadlineExceeded) && !conn.IsClosed():
			pctx, cancel := context.WithTimeout(f.ctx, f.s.opts.ConnectTimeout)
			err = conn.Ping(pctx)
			cancel()
			if err == nil {
				continue
			}
		}
		return err
	}
}

func (f *feed) handle(payload string) {
	n, changes, ok := decodeNotice(payload)
	if !ok || n.Origin == f.origin || n.Schema != f.schema {
		return
	}
	newcomer := f.heard(n)
	// A Here that says its sender dropped changes while it thought itself
	// alone: what this instance, listening since less than a peerTTL, may
	// have missed of them is read again.
	if n.Rescan || n.Here && n.Skipped && newcomer {
		f.deliver(runtime.Change{Rescan: true})
	}
	for _, c := range changes {
		f.deliver(c)
	}
}

// deliver queues a change for every subscriber.
func (f *feed) deliver(c runtime.Change) {
	f.subMu.Lock()
	subs := make([]*subscription, 0, len(f.subs))
	for _, sub := range f.subs {
		subs = append(subs, sub)
	}
	f.subMu.Unlock()
	for _, sub := range subs {
		sub.push(c)
	}
}

// SubscribeChanges implements runtime.ChangeFeed. fn is called from one
// goroutine of its own, in order, with the changes committed through other
// Store instances on the same database and schema, and with a Rescan when
// some may have been missed: after the feed reconnected, when another
// instance could not send its changes, or when fn fell more than
// maxSubQueue changes behind (the queue never blocks the store). After
// cancel returns, fn is not called again, except for a call in progress.
func (s *Store) SubscribeChanges(fn func(runtime.Change)) (cancel func()) {
	f := s.feed
	sub := &subscription{fn: fn, wake: make(chan struct{}, 1), done: make(chan struct{})}
	f.subMu.Lock()
	if f.closed {
		f.subMu.Unlock()
		return func() {}
	}
	f.nextSub++
	id := f.nextSub
	f.subs[id] = sub
	f.subMu.Unlock()
	go sub.run()
	return func() {
		f.subMu.Lock()
		delete(f.subs, id)
		f.subMu.Unlock()
		sub.stop()
	}
}

// subscription is one subscriber's queue and goroutine.
type subscription struct {
	fn   func(runtime.Change)
	wake chan struct{}
	done chan struct{}

	mu      sync.Mutex
	queue   []runtime.Change
	stopped bool
}

func (sub *subscription) push(c runtime.Change) {
	sub.mu.Lock()
	switch {
	case sub.stopped:
	case len(sub.queue) >= maxSubQueue:
		sub.queue = append(sub.queue[:0], runtime.Change{Rescan: true})
	case c.Rescan && len(sub.queue) > 0 && sub.queue[len(sub.queue)-1].Rescan:
	default:
		sub.queue = append(sub.queue, c)
	}
	sub.mu.Unlock()
	select {
	case sub.wake <- struct{}{}:
	default:
	}
}

func (sub *subscription) stop() {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if !sub.stopped {
		sub.stopped = true
		sub.queue = nil
		close(sub.done)
	}
}

func (sub *subscription) run() {
	for {
		select {
		case <-sub.done:
			return
		case <-sub.wake:
		}
		for {
			sub.mu.Lock()
			q := sub.queue
			sub.queue = nil
			sub.mu.Unlock()
			if len(q) == 0 {
				break
			}
			for _, c := range q {
				sub.mu.Lock()
				stopped := sub.stopped
				sub.mu.Unlock()
				if stopped {
					return
				}
				sub.fn(c)
			}
		}
	}
}
