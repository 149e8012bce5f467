package sse

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/taskrunner/taskrunner/platform/follow"
)

// The topic's writer serves its parked streams (see stream.park): streams
// that have caught up with the ring and whose connections were taken over.
// They have no goroutine of their own. When frames arrive (or a heartbeat
// is due) the hub starts one writer goroutine for the topic, which goes
// round the parked streams, a chunk at a time, until it has been once
// round without anything to write:
//
//   - a chunk takes the ring as it is now: frames that arrive while the
//     writer is going round reach the streams it has not visited yet in
//     the same round (so every frame reaches every stream within one
//     round), and a stream gets everything it has not read in one write;
//   - streams with equal cursors (ring position, last seq, view, seed
//     state: all that kept up) share one rendering of their frames, made
//     once per ring head;
//   - each stream gets one non-blocking write(2) (liveConn.tryWrite): no
//     goroutine wakes per client and no deadline is set per frame;
//   - after 2 ms of writing the writer offers its CPU between two chunks
//     (yieldAfter), so a long round does not hold back the event path.
//
// A stream leaves the writer, back to a goroutine of its own (stream.resume),
// when a write does not go through whole (its client is slow: the
// goroutine writes the rest under the write timeout, and the ring cut-off
// applies as before), when a frame comes with a seq gap (the goroutine
// fills it from the log), after a Redis resubscription (it replays) or
// when a status check asks for it. It parks again once caught up.

// cursor is a stream's position in its timeline: everything needed to
// render the next frames for it.
type cursor struct {
	view view
	seed seedView
	last int64 // highest seq processed; only strictly greater ones follow
	sent int64 // highest seq written as an id (viewFull: always last)
}

// appendLive renders f for cur and advances it; ended is true after the
// final event.
func (cur *cursor) appendLive(dst []byte, f *frame) (out []byte, ended bool, err error) {
	if cur.view == viewFull {
		cur.last, cur.sent = f.seq, f.seq
		return append(dst, f.data...), f.final, nil
	}
	e, err := f.event()
	if err != nil {
		return dst, false, err
	}
	dst, ended = cur.appendSeed(dst, e)
	return dst, ended, nil
}

// groupKey: parked streams with equal keys get the same bytes.
type groupKey struct {
	next uint64
	cur  cursor
}

// group is what one pass writes to the streams of one key.
type group struct {
	key     groupKey
	members []*watcher
	out     []byte
	next    uint64 // ring position after the frames rendered
	read    uint64 // their bytes (for queued_bytes)
	cur     cursor // the cursor after them
	pooled  bool   // out is from groupBufs (else a frame's own bytes, shared)
	done    bool   // rendered
	ended   bool   // the final event is in out (and the view's end)
	fill    bool   // a gap before the frame at next: the log must fill it
	err     error  // the frames could not be rendered
}

var groupBufs = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// render fills g from frames (ring positions lo, lo+1, …).
func (g *group) render(frames []*frame, lo uint64) {
	g.cur, g.next = g.key.cur, g.key.next
	for ; g.next-lo < uint64(len(frames)); g.next++ {
		f := frames[g.next-lo]
		switch follow.Next(g.cur.last, f.seq) {
		case follow.Skip:
			g.read += uint64(len(f.data))
			continue
		case follow.Fill:
			g.fill = true
			return
		}
		if g.out == nil {
			if g.cur.view == viewFull && g.next-lo == uint64(len(frames))-1 {
				// The one frame: written as the hub framed it.
				g.cur.last, g.cur.sent = f.seq, f.seq
				g.out, g.ended = f.data, f.final
				g.read += uint64(len(f.data))
				g.next++
				break
			}
			g.out, g.pooled = (*groupBufs.Get().(*[]byte))[:0], true
		}
		g.out, g.ended, g.err = g.cur.appendLive(g.out, f)
		if g.err != nil {
			return
		}
		g.read += uint64(len(f.data))
		if g.ended {
			g.next++
			break
		}
	}
	if g.ended && g.cur.view == viewSeed {
		if !g.pooled {
			g.out, g.pooled = append((*groupBufs.Get().(*[]byte))[:0], g.out...), true
		}
		g.out = g.cur.appendEnd(g.out)
	}
}

// release gives a pooled buffer back.
func (g *group) release() {
	if g.pooled && cap(g.out) <= 256<<10 {
		b := g.out[:0]
		groupBufs.Put(&b)
	}
	g.out, g.pooled = nil, false
}

// chunkSize is how many parked streams the writer visits between two
// looks at the ring (and two takes of the hub's lock).
const chunkSize = 64

// yieldAfter is how long the writer writes before it offers its CPU to
// whatever else waits for one (yieldCPU, between two chunks): the event
// path's commits and acknowledgements, other topics' writers, the clients
// reading what it wrote. A round over a thousand streams takes several
// milliseconds of CPU; without the offer, the next event's commit waits
// for much of it, the publisher's acknowledgements come later and each
// write carries fewer frames. Only a writer with hundreds of streams
// reaches it: small topics' rounds end well before (with a yield after
// every chunk, 50 topics of 4 streams took bench-events' paced p99 from 15
// to 138 ms, since a descheduled thread keeps its Go P for a while).
// Measured in make bench-sse, 1 task × 1,000 subscribers, sequential
// publisher, four alternating rounds on 2 CPUs: deliveries 1.86–2.05× the
// reference hub's without a yield, 2.22–2.43× with one every 2 ms (e2e p99
// 0.37–0.48× and 0.32–0.48× of its p99); every 0.5 ms gave 2.5–3.3× but
// longer rounds (p99 0.39–0.77×).
const yieldAfter = 2 * time.Millisecond

// work is one stream's write in a chunk.
type work struct {
	w       *watcher
	g       *group
	n       int   // bytes of g.out written
	err     error // the write failed: the client is gone
	pending []byte
}

// pingGroup is the heartbeat, for parked streams that wrote nothing for a
// whole heartbeat round.
var pingGroup = &group{out: []byte(heartbeatComment)}

// kickLocked starts t's writer unless it runs or nothing is parked.
func (h *hub) kickLocked(t *topic) {
	if t.writing || len(t.parked) == 0 {
		return
	}
	t.writing = true
	t.roundStart, t.roundVisits, t.roundWrote = time.Now(), 0, false
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		h.write(t)
	}()
}

// scratch is a writer's working memory, passed from writer to writer
// (scratches): a writer starts for every burst of frames, and growing these
// anew each time was most of what the hub allocated.
type scratch struct {
	chunk  []work
	frames []*frame
	resume []*watcher
	groups map[groupKey]*group // renderings for the ring head at rendered
}

var scratches = sync.Pool{New: func() any {
	return &scratch{chunk: make([]work, 0, chunkSize), groups: map[groupKey]*group{}}
}}

// write is t's writer (see the top of this file).
func (h *hub) write(t *topic) {
	sc := scratches.Get().(*scratch)
	var (
		chunk, frames, resume = sc.chunk[:0], sc.frames[:0], sc.resume[:0]
		groups                = sc.groups
		idle                  int          // streams visited in a row with nothing to write
		ran                   = time.Now() // since the writer started or last yielded
	)
	rendered := ^uint64(0)
	defer func() {
		for k, g := range groups {
			g.release()
			delete(groups, k)
		}
		clear(resume)
		sc.chunk, sc.frames, sc.resume = chunk[:0], frames[:0], resume[:0]
		scratches.Put(sc)
	}()
	for {
		h.mu.Lock()
		if t.roundVisits > 0 && t.roundVisits >= len(t.parked) {
			h.roundEndedLocked(t)
		}
		if idle >= len(t.parked) && !h.dueLocked(t) {
			t.writing = false
			h.mu.Unlock()
			return
		}
		if t.head != rendered {
			for k, g := range groups {
				g.release()
				delete(groups, k)
			}
			rendered = t.head
		}
		chunk, resume = chunk[:0], resume[:0]
		lo := t.head
		for visits := 0; len(chunk) < chunkSize && visits < len(t.parked); visits++ {
			if t.pos >= len(t.parked) {
				t.pos = 0
			}
			t.roundVisits++
			w := t.parked[t.pos]
			t.pos++
			switch {
			case w.resync || w.check:
				resume = append(resume, w)
			case w.next < t.head:
				k := groupKey{next: w.next, cur: w.s.cursor}
				g := groups[k]
				if g == nil {
					g = &group{key: k}
					groups[k] = g
				}
				chunk = append(chunk, work{w: w, g: g})
				lo = min(lo, w.next)
			case w.pinged+1 < h.round:
				chunk = append(chunk, work{w: w, g: pingGroup})
			default:
				idle++
			}
		}
		for _, w := range resume {
			w.s.checkNow, w.check = w.check, false
			h.unparkLocked(t, w)
		}
		if len(chunk) > 0 {
			idle = 0
			t.roundWrote = true
			size := uint64(len(t.ring))
			frames = frames[:0]
			for p := lo; p < t.head; p++ {
				frames = append(frames, t.ring[p%size])
			}
		}
		h.mu.Unlock()
		h.resumeAll(resume)

		for i := range chunk {
			c := &chunk[i]
			g := c.g
			if g != pingGroup && !g.done {
				g.render(frames, lo)
				g.done = true
			}
			if g.err != nil || len(g.out) == 0 {
				continue
			}
			c.n, c.err = c.w.s.conn.tryWrite(g.out)
			if c.err == nil && c.n < len(g.out) {
				c.pending = append([]byte(nil), g.out[c.n:]...)
			}
		}
		h.apply(t, chunk)
		clear(frames)
		clear(chunk)
		if time.Since(ran) >= yieldAfter {
			yieldCPU()
			ran = time.Now()
		}
	}
}

// roundEndedLocked is called once t's writer has visited as many streams as
// are parked since its round began (at its start, or when the last round
// ended; a round ends between two chunks): a round that wrote something is
// recorded in taskrunner.sse.round_duration. A round's length is how long
// the last stream of a task waits for an event that reached the hub just
// after the writer passed it, so its distribution is the fan-out's share of
// the delivery latency.
func (h *hub) roundEndedLocked(t *topic) {
	now := time.Now()
	if t.roundWrote {
		if r := h.rounds.Load(); r != nil {
			(*r).Record(context.Background(), now.Sub(t.roundStart).Seconds())
		}
	}
	t.roundStart, t.roundVisits, t.roundWrote = now, 0, false
}

// dueLocked reports whether a parked stream of t has something to write or
// must go back to a goroutine (the writer's last look before it stops).
func (h *hub) dueLocked(t *topic) bool {
	for _, w := range t.parked {
		if w.next < t.head || w.resync || w.check || w.pinged+1 < h.round {
			return true
		}
	}
	return false
}

// apply records a chunk's outcomes: cursors advance; streams that ended,
// failed or were left with bytes to write leave the writer.
func (h *hub) apply(t *topic, chunk []work) {
	var ended, resume []*watcher
	h.mu.Lock()
	for i := range chunk {
		c := &chunk[i]
		w := c.w
		if !w.parked {
			continue // dropped meanwhile (its stream was ended)
		}
		w.pinged = h.round
		switch {
		case c.err != nil, c.g.err != nil:
			h.unparkLocked(t, w)
			w.s.endErr = errors.Join(c.err, c.g.err)
			ended = append(ended, w)
			continue
		case c.g == pingGroup:
			if c.pending != nil {
				h.unparkLocked(t, w)
				w.s.pending = c.pending
				resume = append(resume, w)
			}
			continue
		}
		w.next = c.g.next
		w.readByte += c.g.read
		w.s.cursor = c.g.cur
		switch {
		case c.pending != nil:
			h.unparkLocked(t, w)
			w.s.pending, w.s.endAfterPending = c.pending, c.g.ended
			resume = append(resume, w)
		case c.g.ended:
			h.unparkLocked(t, w)
			ended = append(ended, w)
		case c.g.fill:
			h.unparkLocked(t, w)
			resume = append(resume, w)
		}
	}
	h.mu.Unlock()
	for _, w := range ended {
		w.s.end(w.s.endErr)
	}
	h.resumeAll(resume)
}

// unparkLocked takes w out of t's parked list: its stream goes back to a
// goroutine (the caller starts it) or ends.
func (h *hub) unparkLocked(t *topic, w *watcher) {
	if !w.parked {
		return
	}
	last := len(t.parked) - 1
	moved := t.parked[last]
	t.parked[w.idx], moved.idx = moved, w.idx
	t.parked[last] = nil
	t.parked = t.parked[:last]
	w.parked, w.idx = false, -1
}

// resumeAll starts a goroutine for each unparked stream.
func (h *hub) resumeAll(ws []*watcher) {
	for _, w := range ws {
		go w.s.resume()
	}
}
