package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// watcher is one browser watching a task over SSE: it parses id: and data:
// lines, takes the sender's timestamp from the event's "time" field and
// records now minus that as the end-to-end latency. When the stream breaks
// (the gateway cuts slow clients) it reconnects with Last-Event-ID, as
// EventSource does, and counts that.
type watcher struct {
	client *http.Client
	url    string
	token  string

	last       atomic.Int64 // runner events received in order (the timeline's control-plane events not counted)
	raw        atomic.Int64 // highest SSE id received (Last-Event-ID)
	cp         int64        // control-plane events received
	reconnects atomic.Int64
	mu         sync.Mutex
	lat        []time.Duration
	errs       []error
}

// run streams until ctx ends. ready is called once the first connection's
// Redis subscription is confirmed (the handler's retry hint comes after it).
func (w *watcher) run(ctx context.Context, ready func()) {
	first := true
	for ctx.Err() == nil {
		err := w.stream(ctx, func() {
			if first {
				first = false
				ready()
			}
		})
		if ctx.Err() != nil {
			return
		}
		w.mu.Lock()
		w.errs = append(w.errs, err)
		w.mu.Unlock()
		w.reconnects.Add(1)
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (w *watcher) stream(ctx context.Context, connected func()) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+w.token)
	req.Header.Set("Accept", "text/event-stream")
	if n := w.raw.Load(); n > 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatInt(n, 10))
	}
	resp, err := w.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("sse: %s", resp.Status)
	}
	rd := bufio.NewReaderSize(resp.Body, 64<<10)
	var id int64
	var typ []byte
	var sent time.Time
	for {
		line, err := rd.ReadSlice('\n')
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				return errors.New("sse: line longer than 64 KiB")
			}
			return fmt.Errorf("sse: stream ended: %w", err)
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0: // end of a message
			if id > w.raw.Load() {
				w.raw.Store(id)
				if controlPlane[string(typ)] {
					w.cp++ // the task's status changes: no publisher sent them
				} else if !sent.IsZero() {
					d := time.Since(sent)
					w.mu.Lock()
					w.lat = append(w.lat, d)
					w.mu.Unlock()
					w.last.Store(id - w.cp)
				}
			}
			id, typ, sent = 0, typ[:0], time.Time{}
		case bytes.HasPrefix(line, []byte("event:")):
			typ = append(typ[:0], bytes.TrimSpace(line[6:])...)
		case bytes.HasPrefix(line, []byte("retry:")):
			connected()
		case bytes.HasPrefix(line, []byte("id:")):
			id, _ = strconv.ParseInt(string(bytes.TrimSpace(line[3:])), 10, 64)
		case bytes.HasPrefix(line, []byte("data:")):
			sent, _ = EventTime(line[5:])
		}
	}
}

var timeKey = []byte(`"time":`)

// EventTime finds the "time" field of an event's protojson form without
// decoding the whole message (protojson may put a space after the colon).
func EventTime(data []byte) (time.Time, error) {
	i := bytes.Index(data, timeKey)
	if i < 0 {
		return time.Time{}, errors.New("no time field")
	}
	rest := bytes.TrimLeft(data[i+len(timeKey):], " ")
	if len(rest) == 0 || rest[0] != '"' {
		return time.Time{}, errors.New("time is not a string")
	}
	end := bytes.IndexByte(rest[1:], '"')
	if end < 0 {
		return time.Time{}, errors.New("unterminated time")
	}
	return time.Parse(time.RFC3339Nano, string(rest[1:1+end]))
}
