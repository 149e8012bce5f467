package sse

import (
	"errors"
	"sync"

	"github.com/taskrunner/taskrunner/platform/follow"
)

// The topic's writer serves its parked streams (see stream.park): streams
// that have caught up with the ring and whose connections were taken over.
// They have no goroutine of their own. When frames arrive (or a heartbeat
// is due) the hub starts one writer goroutine for the topic, which, until
// no parked stream has anything left to read:
//
//   - groups the parked streams by their cursor (ring position, last seq,
//     view, seed state): streams that have kept up are all in one group;
//   - renders each group's frames once, as one buffer;
//   - writes that buffer to each stream of the group with one non-blocking
//     write(2) (liveConn.tryWrite): no goroutine wakes per client, no
//     deadline is set per frame, and every frame that arrived since the
//     last pass goes in the same syscall.
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

// outcome of one stream in a pass.
type outcome struct {
	w       *watcher
	g       *group
	n       int   // bytes of g.out written
	err     error // the write failed: the client is gone
	pending []byte
}

// kickLocked starts t's writer unless it runs or nothing is parked.
func (h *hub) kickLocked(t *topic) {
	if t.writing || t.parked == 0 {
		return
	}
	t.writing = true
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		h.write(t)
	}()
}

// write is t's writer (see the top of this file).
func (h *hub) write(t *topic) {
	var (
		frames  []*frame
		groups  = map[groupKey]*group{}
		order   []*group
		results []outcome
		ping    = &group{out: []byte(heartbeatComment)}
	)
	for {
		h.mu.Lock()
		var lo uint64
		var resume []*watcher
		frames, lo, resume = h.collectLocked(t, frames[:0], groups, &order, ping)
		if len(order) == 0 && len(ping.members) == 0 {
			t.writing = false
			h.mu.Unlock()
			h.resumeAll(resume)
			return
		}
		h.mu.Unlock()
		h.resumeAll(resume)

		results = results[:0]
		for _, g := range append(order, ping) {
			if g != ping {
				g.render(frames, lo)
			}
			for _, w := range g.members {
				o := outcome{w: w, g: g}
				if g.err == nil && len(g.out) > 0 {
					o.n, o.err = w.s.conn.tryWrite(g.out)
					if o.err == nil && o.n < len(g.out) {
						o.pending = append([]byte(nil), g.out[o.n:]...)
					}
				}
				results = append(results, o)
			}
		}
		h.apply(t, results, ping)
		for _, g := range order {
			g.release()
			delete(groups, g.key)
		}
		order = order[:0]
		ping.members = ping.members[:0]
		clear(frames)
		clear(results)
	}
}

// collectLocked picks the parked streams with something to write: frames
// they have not read (grouped by cursor into groups/order) or a heartbeat
// due (into ping). Parked streams that must go back to a goroutine (a
// resync or a status check) are unparked and returned. frames gets the
// ring from the lowest position needed; lo is that position.
func (h *hub) collectLocked(t *topic, frames []*frame, groups map[groupKey]*group, order *[]*group, ping *group) ([]*frame, uint64, []*watcher) {
	var resume []*watcher
	lo := t.head
	pingDue := t.pingDue
	t.pingDue = false
	for w := range t.watchers {
		if !w.parked {
			continue
		}
		switch {
		case w.resync || w.check:
			w.s.checkNow, w.check = w.check, false
			h.unparkLocked(t, w)
			resume = append(resume, w)
		case w.next < t.head:
			k := groupKey{next: w.next, cur: w.s.cursor}
			g := groups[k]
			if g == nil {
				g = &group{key: k}
				groups[k] = g
				*order = append(*order, g)
			}
			g.members = append(g.members, w)
			lo = min(lo, w.next)
		case pingDue && w.pinged+1 < h.round:
			ping.members = append(ping.members, w)
		}
	}
	if len(*order) > 0 {
		size := uint64(len(t.ring))
		for p := lo; p < t.head; p++ {
			frames = append(frames, t.ring[p%size])
		}
	}
	return frames, lo, resume
}

// apply records a pass's outcomes: cursors advance; streams that ended,
// failed or were left with bytes to write leave the writer.
func (h *hub) apply(t *topic, results []outcome, ping *group) {
	var ended []*watcher
	var resume []*watcher
	h.mu.Lock()
	for i := range results {
		o := &results[i]
		w := o.w
		if !w.parked {
			continue // dropped meanwhile (its stream was ended)
		}
		w.pinged = h.round
		switch {
		case o.err != nil, o.g.err != nil:
			h.unparkLocked(t, w)
			w.s.endErr = errors.Join(o.err, o.g.err)
			ended = append(ended, w)
			continue
		case o.g == ping:
			if o.pending != nil {
				h.unparkLocked(t, w)
				w.s.pending = o.pending
				resume = append(resume, w)
			}
			continue
		}
		w.next = o.g.next
		w.readByte += o.g.read
		w.s.cursor = o.g.cur
		switch {
		case o.pending != nil:
			h.unparkLocked(t, w)
			w.s.pending, w.s.endAfterPending = o.pending, o.g.ended
			resume = append(resume, w)
		case o.g.ended:
			h.unparkLocked(t, w)
			ended = append(ended, w)
		case o.g.fill:
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

// unparkLocked hands w's stream back to a goroutine (the caller starts it).
func (h *hub) unparkLocked(t *topic, w *watcher) {
	w.parked = false
	t.parked--
}

// resumeAll starts a goroutine for each unparked stream.
func (h *hub) resumeAll(ws []*watcher) {
	for _, w := range ws {
		go w.s.resume()
	}
}
