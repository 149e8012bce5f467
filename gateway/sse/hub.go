package sse

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"

	"github.com/taskrunner/taskrunner/platform/eventwire"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// frame is one event ready to be written: it is framed once by the hub
// and shared by every watcher of the task.
type frame struct {
	seq     int64
	final   bool   // the last event of the timeline
	payload []byte // the event's eventwire JSON
	data    []byte // viewFull's message: "id: …\nevent: …\ndata: …\n\n"

	// The decoded event, for the seed view: decoded once, on first use.
	once sync.Once
	ev   *taskrunnerv1.Event
	err  error
}

// event decodes the frame's event (once for every watcher).
func (f *frame) event() (*taskrunnerv1.Event, error) {
	f.once.Do(func() { f.ev, f.err = eventwire.DecodeEvent(f.payload) })
	return f.ev, f.err
}

// encodeFrame renders e as viewFull's message (the replay's path).
func encodeFrame(dst []byte, e *taskrunnerv1.Event) ([]byte, error) {
	body, err := eventwire.EncodeEvent(e)
	if err != nil {
		return dst, err
	}
	return appendFrame(dst, e.GetSeq(), eventwire.TypeName(e), body)
}

// Why a watcher was dropped by the hub.
const (
	dropSlow     = "client too slow: it fell a whole ring behind"
	dropShutdown = "gateway shutting down"
	dropGone     = "client closed the connection"
)

// watcher is one SSE connection's view of the hub: a position in its
// topic's ring, and a wake-up signal. It holds no queue of its own.
type watcher struct {
	wake chan struct{} // capacity 1: frames, a resync or the drop await
	s    *stream       // the stream it feeds

	// Guarded by the hub's mu.
	next     uint64 // ring position of the next frame to read
	readByte uint64 // the topic's byte count at next (bytes queued = topic's − this)
	resync   bool   // the subscription was re-established: replay
	topic    *topic // set by join
	reason   string // why the hub dropped the watcher
	parked   bool   // the topic's writer owns the stream (see writer.go)
	idx      int    // its index in the topic's list of parked watchers
	check    bool   // a status check wants the parked stream back on a goroutine
	pinged   uint64 // the heartbeat round of the last write while parked

	dropped atomic.Bool // set (after reason) when the hub drops the watcher

	// cut unblocks a write in progress once the watcher is dropped; mu and
	// done keep it from touching a connection whose handler has returned.
	cut  func()
	mu   sync.Mutex
	done bool
}

func newWatcher(s *stream, cut func()) *watcher {
	return &watcher{wake: make(chan struct{}, 1), s: s, cut: cut}
}

// setCut replaces the cut (the connection was taken over).
func (w *watcher) setCut(cut func()) {
	w.mu.Lock()
	w.cut = cut
	w.mu.Unlock()
}

// signal wakes the watcher's stream (never blocks).
func (w *watcher) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// finish marks the handler as returned: cut becomes a no-op.
func (w *watcher) finish() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}

func (w *watcher) cutOff() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done && w.cut != nil {
		w.cut()
	}
}

// topic is one subscribed task channel, its local watchers, and the ring of
// its recent frames that every watcher reads at its own position. A frame
// stays in the ring until every watcher has read it (or was dropped for
// being a whole ring behind), so the ring holds what the slowest watcher
// has not read yet, once for all of them.
type topic struct {
	watchers map[*watcher]struct{}
	ready    chan struct{} // closed on the subscription's confirmation
	isReady  bool
	readyAt  time.Time // when it was confirmed: every event committed later reaches the hub
	maxSeq   int64     // highest seq seen on the channel

	ring  []*frame // allocated with the first frame; position p at ring[p%len]
	head  uint64   // positions appended so far
	tail  uint64   // oldest position still held (older slots are nil)
	bytes uint64   // frame bytes appended so far

	parked  []*watcher // watchers whose streams the writer owns, in the writer's round-robin order
	pos     int        // where the writer's next chunk starts in parked
	writing bool       // the writer goroutine runs

	roundStart  time.Time // when the writer's current round began
	roundVisits int       // streams the writer has visited since
	roundWrote  bool      // … and written to some
}

// hub multiplexes every SSE connection of the process over one Redis
// pub/sub connection: a task's channel is subscribed when its first watcher
// joins and unsubscribed when its last one leaves, and each message is
// decoded once, framed once, put in the topic's ring and its watchers woken
// without blocking. A watcher whose unread frames would be overwritten
// (the ring's size behind) is dropped: that is the "slow client" cut.
type hub struct {
	ps       *redis.PubSub
	prefix   string
	ringSize int
	log      *slog.Logger

	mu      sync.Mutex
	topics  map[string]*topic
	pending map[string]int // SUBSCRIBE commands sent and not yet confirmed
	closed  bool

	cutSlow atomic.Int64 // watchers dropped for being too slow, ever
	round   uint64       // heartbeat rounds so far (guarded by mu)
	mon     *monitor     // tells when the client of a taken-over connection leaves

	rounds atomic.Pointer[metric.Float64Histogram] // taskrunner.sse.round_duration, once registered

	wg sync.WaitGroup
}

var errHubClosed = errors.New("sse: shutting down")

func newHub(rdb redis.UniversalClient, prefix string, ringSize int, log *slog.Logger) *hub {
	h := &hub{
		ps:     rdb.Subscribe(context.Background()),
		prefix: prefix, ringSize: ringSize, log: log,
		topics: map[string]*topic{}, pending: map[string]int{},
	}
	mon, err := newMonitor()
	if err != nil {
		// Departed clients are then noticed by their next failed write.
		log.Warn("sse: no close monitor", "error", err)
	}
	h.mon = mon
	// ChannelWithSubscriptions also yields the confirmations we wait for
	// and the resubscriptions after a reconnect. Our reader never blocks,
	// so the go-redis buffer (which drops messages after a send timeout)
	// does not fill.
	msgs := h.ps.ChannelWithSubscriptions(redis.WithChannelSize(4096))
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		h.run(msgs)
	}()
	return h
}

func (h *hub) run(msgs <-chan any) {
	for m := range msgs {
		switch m := m.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				h.confirmed(m.Channel)
			}
		case *redis.Message:
			h.deliver(m)
		}
	}
}

// confirmed handles a subscribe confirmation: it makes a new topic ready,
// or, for a topic that already was (go-redis resubscribed after a lost
// connection, during which messages may have been missed), asks every
// watcher to catch up from the event log.
func (h *hub) confirmed(channel string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := h.pending[channel]; n > 1 {
		h.pending[channel] = n - 1
	} else {
		delete(h.pending, channel)
	}
	t := h.topics[channel]
	switch {
	case t == nil:
	case !t.isReady:
		if h.pending[channel] == 0 { // an older SUBSCRIBE's answer is not ours
			t.isReady, t.readyAt = true, time.Now()
			close(t.ready)
		}
	default:
		// Pages fetched during the outage may miss what was published in it.
		t.readyAt = time.Now()
		for w := range t.watchers {
			w.resync = true
			if !w.parked {
				w.signal()
			}
		}
		h.kickLocked(t) // the writer gives its streams back to replay
	}
}

func (h *hub) deliver(m *redis.Message) {
	// The live path never parses the event's JSON: the message header has
	// what framing needs, and the payload is written as it is.
	msg, err := eventwire.DecodeMessage([]byte(m.Payload))
	var data []byte
	if err == nil {
		data, err = appendFrame(make([]byte, 0, len(msg.Payload)+len(msg.Type)+40), msg.Seq, msg.Type, msg.Payload)
	}
	if err != nil {
		h.log.Warn("sse: undecodable message on channel", "channel", m.Channel, "error", err)
		return
	}
	f := &frame{seq: msg.Seq, final: msg.Final, payload: msg.Payload, data: data}
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.topics[m.Channel]
	if t == nil {
		return
	}
	if t.ring == nil {
		t.ring = make([]*frame, h.ringSize)
	}
	size := uint64(len(t.ring))
	pos := t.head
	minNext := pos
	for w := range t.watchers {
		if pos >= size && w.next <= pos-size {
			// Its next unread frame is the one this one overwrites.
			h.dropLocked(m.Channel, t, w, dropSlow)
			h.cutSlow.Add(1)
			h.log.Info("sse: client cut off: it fell a whole ring behind", "channel", m.Channel, "ring", size)
			continue
		}
		minNext = min(minNext, w.next)
		if !w.parked {
			w.signal()
		}
	}
	// Let go of the frames every watcher has read.
	for ; t.tail < minNext; t.tail++ {
		t.ring[t.tail%size] = nil
	}
	t.ring[pos%size] = f
	t.head++
	t.maxSeq = max(t.maxSeq, f.seq)
	t.bytes += uint64(len(f.data))
	if t.head-t.tail > size {
		t.tail = t.head - size
	}
	h.kickLocked(t)
}

// park hands w's stream to its topic's writer if it has read every frame
// and nothing else needs its goroutine; on true the caller's goroutine must
// not touch the stream again.
func (h *hub) park(w *watcher) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := w.topic
	if h.closed || t == nil || w.reason != "" || w.resync || w.check || w.next != t.head {
		return false
	}
	if _, ok := t.watchers[w]; !ok {
		return false
	}
	w.parked, w.pinged, w.idx = true, h.round, len(t.parked)
	t.parked = append(t.parked, w)
	return true
}

// gone drops w: its client closed the connection (the close monitor).
func (h *hub) gone(taskID string, w *watcher) {
	channel := eventwire.Channel(h.prefix, taskID)
	h.mu.Lock()
	defer h.mu.Unlock()
	if t := h.topics[channel]; t != nil {
		if _, ok := t.watchers[w]; ok {
			h.dropLocked(channel, t, w, dropGone)
		}
	}
}

// heartbeat begins a heartbeat round: each topic's writer pings its parked
// streams that have written nothing since the round before.
func (h *hub) heartbeat() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.round++
	for _, t := range h.topics {
		h.kickLocked(t)
	}
}

// parkedStreams lists one parked stream per token and task (for the status
// checks).
func (h *hub) parkedStreams() map[taskKey]*stream {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[taskKey]*stream{}
	for _, t := range h.topics {
		for w := range t.watchers {
			if w.parked {
				out[taskKey{w.s.tok, w.s.taskID}] = w.s
			}
		}
	}
	return out
}

// recheck gives every parked stream of key back to a goroutine that checks
// the task's status first.
func (h *hub) recheck(key taskKey) {
	channel := eventwire.Channel(h.prefix, key.task)
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.topics[channel]
	if t == nil {
		return
	}
	for w := range t.watchers {
		if w.parked && w.s.tok == key.token {
			w.check = true
		}
	}
	h.kickLocked(t)
}

// read appends to dst the frames w has not read yet (at most cap(dst)),
// and reports a pending resync; a dropped watcher gets its reason.
func (h *hub) read(w *watcher, dst []*frame) (frames []*frame, resync bool, dropped string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if w.reason != "" {
		return dst, false, w.reason
	}
	resync, w.resync = w.resync, false
	t := w.topic
	if t == nil || t.ring == nil {
		return dst, resync, ""
	}
	size := uint64(len(t.ring))
	for w.next < t.head && len(dst) < cap(dst) {
		f := t.ring[w.next%size]
		dst = append(dst, f)
		w.next++
		w.readByte += uint64(len(f.data))
	}
	if w.next < t.head {
		w.signal() // more to read: come back
	}
	return dst, resync, ""
}

// queued is the bytes of frames written to the rings and not yet read, over
// every watcher (a gauge: what slow clients cost).
func (h *hub) queued() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var n uint64
	for _, t := range h.topics {
		for w := range t.watchers {
			n += t.bytes - w.readByte
		}
	}
	return int64(n)
}

// joined is what a stream needs to know about its topic once it joined.
type joined struct {
	// readyAt: every event committed after it reached the hub, so a replay
	// page fetched after it holds everything the live feed does not.
	readyAt time.Time
	// seen: the highest seq the hub saw before the watcher joined; a
	// stream whose replay ends below it must replay again (those events
	// reached the hub before the watcher was there).
	seen int64
}

// join adds w to taskID's topic, subscribing the channel for the first
// watcher, and waits until the subscription is confirmed by Redis: only
// then can a replay that follows miss nothing.
func (h *hub) join(ctx context.Context, taskID string, w *watcher) (joined, error) {
	channel := eventwire.Channel(h.prefix, taskID)
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return joined{}, errHubClosed
	}
	t := h.topics[channel]
	if t == nil {
		t = &topic{watchers: map[*watcher]struct{}{}, ready: make(chan struct{})}
		h.topics[channel] = t
		h.pending[channel]++
		// Under h.mu so SUBSCRIBE and UNSUBSCRIBE of a channel reach Redis
		// in the order the topic map changed.
		if err := h.ps.Subscribe(ctx, channel); err != nil {
			h.pending[channel]--
			delete(h.topics, channel)
			_ = h.ps.Unsubscribe(context.WithoutCancel(ctx), channel)
			h.mu.Unlock()
			return joined{}, err
		}
	}
	t.watchers[w] = struct{}{}
	w.topic, w.next, w.readByte = t, t.head, t.bytes
	ready := t.ready
	h.mu.Unlock()

	for {
		select {
		case <-ready:
			h.mu.Lock()
			j := joined{readyAt: t.readyAt, seen: t.maxSeq}
			h.mu.Unlock()
			return j, nil
		case <-w.wake:
			if w.dropped.Load() {
				return joined{}, errors.New(w.reason)
			}
		case <-ctx.Done():
			h.leave(taskID, w)
			return joined{}, ctx.Err()
		}
	}
}

// leave removes w (if the hub has not dropped it already), unsubscribing
// the channel after its last watcher.
func (h *hub) leave(taskID string, w *watcher) {
	channel := eventwire.Channel(h.prefix, taskID)
	h.mu.Lock()
	if t := h.topics[channel]; t != nil {
		if _, ok := t.watchers[w]; ok {
			delete(t.watchers, w)
			h.unsubscribeIfIdleLocked(channel, t)
		}
	}
	h.mu.Unlock()
}

func (h *hub) unsubscribeIfIdleLocked(channel string, t *topic) {
	if len(t.watchers) > 0 || h.closed {
		return
	}
	delete(h.topics, channel)
	if err := h.ps.Unsubscribe(context.Background(), channel); err != nil {
		// go-redis forgets the channel either way; a stale subscription
		// only costs messages nobody reads.
		h.log.Warn("sse: unsubscribe failed", "channel", channel, "error", err)
	}
}

// dropLocked removes w with a reason and unblocks its writer: a parked
// stream is ended, a stream on its own goroutine is cut (its write fails
// and it ends).
func (h *hub) dropLocked(channel string, t *topic, w *watcher, reason string) {
	delete(t.watchers, w)
	w.reason = reason
	w.dropped.Store(true)
	w.signal()
	h.unsubscribeIfIdleLocked(channel, t)
	parked := w.parked
	if parked {
		h.unparkLocked(t, w)
	}
	// The handler may be blocked writing to that client; cutting happens
	// off the fan-out path so it can never slow anyone else.
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		if parked {
			w.s.end(errors.Join(errEnded, errors.New(reason)))
		} else {
			w.cutOff()
		}
	}()
}

// parkedCount is the number of parked streams (no goroutine of their own).
func (h *hub) parkedCount() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var n int64
	for _, t := range h.topics {
		n += int64(len(t.parked))
	}
	return n
}

// channels is the number of task channels currently subscribed.
func (h *hub) channels() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.topics)
}

// close drops every watcher and closes the Redis connection.
func (h *hub) close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	var parked []*watcher
	for channel, t := range h.topics {
		for w := range t.watchers {
			delete(t.watchers, w)
			w.reason = dropShutdown
			w.dropped.Store(true)
			w.signal()
			if w.parked {
				h.unparkLocked(t, w)
				parked = append(parked, w)
			}
		}
		delete(h.topics, channel)
	}
	h.closed = true
	h.mu.Unlock()
	// Parked streams end here, before close returns (their clients see
	// the end now); the others end on their goroutines.
	for _, w := range parked {
		w.s.end(errEnded)
	}
	_ = h.ps.Close()
	h.wg.Wait()
	h.mon.close()
}
