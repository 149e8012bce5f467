package stages

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/taskrunner/taskrunner/platform/redact"
	"github.com/taskrunner/taskrunner/runner/eventsclient"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// Reporter delivers events to the control plane. *eventsclient.Client implements it. Send must
// not block on the network; Cancelled delivers a server-pushed Cancel's reason.
type Reporter interface {
	Send(ev *taskrunnerv1.Event) (int64, error)
	Cancelled() <-chan string
}

// Log tail limits.
const (
	DefaultLogInterval = 250 * time.Millisecond
	DefaultLogMaxLines = 200
	// maxLogLineBytes bounds one line; a longer one ends with "… [truncated N bytes]".
	maxLogLineBytes = 2000
)

// emitter serialises every event the runner sends and batches log lines: at most one flush
// per interval, with at most maxLines lines (the newest; older ones are counted and replaced
// by a marker). A flush is as many Log events as it takes to keep each under
// eventsclient.LogBatchBytes of lines (the Events service refuses an event over 64 KiB, and
// 200 lines of 2,000 bytes are far more). Pending log lines are always flushed before any
// other event, so the order of events is the order things happened.
type emitter struct {
	rep      Reporter
	red      *redact.Redactor
	log      *slog.Logger
	interval time.Duration
	maxLines int

	mu      sync.Mutex
	stage   taskrunnerv1.TaskStage
	pending []string
	dropped int
	last    time.Time
	timer   *time.Timer
	closed  bool
	inKey   bool // inside a PEM private key that began in an earlier call
}

func newEmitter(rep Reporter, red *redact.Redactor, log *slog.Logger, interval time.Duration, maxLines int) *emitter {
	if interval <= 0 {
		interval = DefaultLogInterval
	}
	if maxLines <= 0 {
		maxLines = DefaultLogMaxLines
	}
	return &emitter{rep: rep, red: red, log: log, interval: interval, maxLines: maxLines}
}

// lines queues log lines of stage after stripping escapes and redacting them.
func (e *emitter) lines(stage taskrunnerv1.TaskStage, lines ...string) {
	if len(lines) == 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	if stage != e.stage && len(e.pending) > 0 {
		e.flushLocked()
	}
	e.stage = stage
	// Redact the lines of one call together, so a secret spanning lines (a PEM key) is caught
	// whole; a key cut across calls is masked until its END line.
	stripped := make([]string, len(lines))
	for i, l := range lines {
		stripped[i] = redact.StripANSI(l)
	}
	joined := e.red.String(strings.Join(stripped, "\n"))
	for _, l := range strings.Split(joined, "\n") {
		switch {
		case e.inKey:
			if strings.Contains(l, "-----END") {
				e.inKey = false
			}
			l = redact.Mask
		case strings.Contains(l, "-----BEGIN") && strings.Contains(l, "PRIVATE KEY"):
			e.inKey = !strings.Contains(l, "-----END")
			l = redact.Mask
		}
		e.pending = append(e.pending, redact.TruncateCounted(l, maxLogLineBytes))
	}
	if over := len(e.pending) - e.maxLines; over > 0 {
		e.pending = append(e.pending[:0:0], e.pending[over:]...)
		e.dropped += over
	}
	wait := e.interval - time.Since(e.last)
	if wait <= 0 {
		e.flushLocked()
		return
	}
	if e.timer == nil {
		e.timer = time.AfterFunc(wait, e.tick)
	}
}

func (e *emitter) tick() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.timer = nil
	if !e.closed {
		e.flushLocked()
	}
}

func (e *emitter) flushLocked() {
	if e.timer != nil {
		e.timer.Stop()
		e.timer = nil
	}
	if len(e.pending) == 0 {
		return
	}
	lines := e.pending
	if e.dropped > 0 {
		lines = append([]string{fmt.Sprintf("… %d earlier lines omitted", e.dropped)}, lines...)
	}
	e.pending, e.dropped = nil, 0
	e.last = time.Now()
	for _, batch := range eventsclient.SplitLines(lines, eventsclient.LogBatchBytes) {
		e.sendLocked(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: batch, Stage: e.stage}}})
	}
}

func (e *emitter) sendLocked(ev *taskrunnerv1.Event) {
	if _, err := e.rep.Send(ev); err != nil {
		e.log.Warn("event not sent", "type", fmt.Sprintf("%T", ev.GetPayload()), "err", err)
	}
}

// send flushes pending log lines, then sends ev.
func (e *emitter) send(ev *taskrunnerv1.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.flushLocked()
	e.sendLocked(ev)
}

// close flushes and stops the timer; later lines are dropped.
func (e *emitter) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.flushLocked()
	e.closed = true
}
