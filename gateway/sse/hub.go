package sse

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/redis/go-redis/v9"

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
	dropSlow     = "client too slow: its queue is full"
	dropShutdown = "gateway shutting down"
)

// watcher is one SSE connection's view of the hub.
type watcher struct {
	queue  chan *frame   // live events, bounded
	resync chan struct{} // the subscription was re-established: replay
	gone   chan struct{} // closed when the hub drops the watcher
	reason string        // why gone closed (written before the close)

	// cut unblocks a write in progress once the watcher is dropped; mu and
	// done keep it from touching a connection whose handler has returned.
	cut  func()
	mu   sync.Mutex
	done bool
}

func newWatcher(queue int, cut func()) *watcher {
	return &watcher{queue: make(chan *frame, queue), resync: make(chan struct{}, 1), gone: make(chan struct{}), cut: cut}
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

// topic is one subscribed task channel and its local watchers.
type topic struct {
	watchers map[*watcher]struct{}
	ready    chan struct{} // closed on the subscription's confirmation
	isReady  bool
}

// hub multiplexes every SSE connection of the process over one Redis
// pub/sub connection: a task's channel is subscribed when its first watcher
// joins and unsubscribed when its last one leaves, and each message is
// decoded once and offered to every watcher without blocking.
type hub struct {
	ps     *redis.PubSub
	prefix string
	log    *slog.Logger

	mu      sync.Mutex
	topics  map[string]*topic
	pending map[string]int // SUBSCRIBE commands sent and not yet confirmed
	closed  bool

	wg sync.WaitGroup
}

var errHubClosed = errors.New("sse: shutting down")

func newHub(rdb redis.UniversalClient, prefix string, log *slog.Logger) *hub {
	h := &hub{
		ps:     rdb.Subscribe(context.Background()),
		prefix: prefix, log: log,
		topics: map[string]*topic{}, pending: map[string]int{},
	}
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
			t.isReady = true
			close(t.ready)
		}
	default:
		for w := range t.watchers {
			select {
			case w.resync <- struct{}{}:
			default:
			}
		}
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
	for w := range t.watchers {
		select {
		case w.queue <- f:
		default:
			h.dropLocked(m.Channel, t, w, dropSlow)
		}
	}
}

// join adds w to taskID's topic, subscribing the channel for the first
// watcher, and waits until the subscription is confirmed by Redis: only
// then can a replay that follows miss nothing.
func (h *hub) join(ctx context.Context, taskID string, w *watcher) error {
	channel := eventwire.Channel(h.prefix, taskID)
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return errHubClosed
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
			return err
		}
	}
	t.watchers[w] = struct{}{}
	ready := t.ready
	h.mu.Unlock()

	select {
	case <-ready:
		return nil
	case <-w.gone:
		return errors.New(w.reason)
	case <-ctx.Done():
		h.leave(taskID, w)
		return ctx.Err()
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

// dropLocked removes w with a reason and unblocks its writer.
func (h *hub) dropLocked(channel string, t *topic, w *watcher, reason string) {
	delete(t.watchers, w)
	w.reason = reason
	close(w.gone)
	h.unsubscribeIfIdleLocked(channel, t)
	// The handler may be blocked writing to that client; cutting happens
	// off the fan-out path so it can never slow anyone else.
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		w.cutOff()
	}()
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
	for channel, t := range h.topics {
		for w := range t.watchers {
			delete(t.watchers, w)
			w.reason = dropShutdown
			close(w.gone)
		}
		delete(h.topics, channel)
	}
	h.closed = true
	h.mu.Unlock()
	_ = h.ps.Close()
	h.wg.Wait()
}
