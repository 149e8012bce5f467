package events

import (
	"context"
	"sync"
	"time"
)

// intake is where runner streams leave their submissions and the group
// committers take them. It keeps a queue per task, and a committer takes
// whole tasks: a task's submissions are in at most one committer's batch at
// a time, so they are committed in the order they arrived, by whichever
// committer takes the task next.
//
// The committers are not equals. The first takes whatever is waiting; the
// others (Config.Committers - 1 of them) only take work while at least
// overflowAt submissions wait, which happens when the first cannot keep up:
// batches form while a commit runs, so a committer keeps its batches full
// only as long as one commit's worth of events arrives during one commit.
// Below that, a second transaction would only split the batches (twice the
// commits, twice the WAL flushes, a longer tail); above it, PostgreSQL works
// on two transactions at once. So the number of committers is a ceiling on
// concurrent commits, not a fixed split of the tasks.
type intake struct {
	mu         sync.Mutex
	tasks      map[string]*taskQueue // tasks with waiting or taken submissions
	ready      []*taskQueue          // tasks with waiting submissions that no committer holds, oldest first
	readyN     int                   // submissions of the ready tasks
	overflowAt int
	waiting    []bool          // by committer: waiting for work
	wake       []chan struct{} // by committer: one-slot wake-up

	// room holds a token per waiting submission (QueueSize in all): a full
	// intake slows the runner streams down (gRPC flow control).
	room chan struct{}
}

// taskQueue is one task's waiting submissions, in arrival order.
type taskQueue struct {
	id    string
	subs  []*submission
	taken bool // a committer's batch holds the task
	ready bool // in intake.ready
}

func newIntake(committers, queueSize, overflowAt int) *intake {
	in := &intake{tasks: map[string]*taskQueue{}, overflowAt: max(overflowAt, 1), waiting: make([]bool, committers),
		wake: make([]chan struct{}, committers), room: make(chan struct{}, queueSize)}
	for k := range in.wake {
		in.wake[k] = make(chan struct{}, 1)
	}
	return in
}

// put queues s for its task. The caller holds a room token for it (see
// enter).
func (in *intake) put(s *submission) {
	in.mu.Lock()
	tq := in.tasks[s.taskID]
	if tq == nil {
		tq = &taskQueue{id: s.taskID}
		in.tasks[s.taskID] = tq
	}
	tq.subs = append(tq.subs, s)
	switch {
	case tq.ready:
		in.readyN++
	case !tq.taken:
		tq.ready = true
		in.ready = append(in.ready, tq)
		in.readyN += len(tq.subs)
	}
	in.wakeLocked()
	in.mu.Unlock()
}

// enter takes a room token, waiting while the intake is full; false means
// done or stop ended the wait.
func (in *intake) enter(done, stop <-chan struct{}) bool {
	select {
	case in.room <- struct{}{}:
		return true
	case <-done:
		return false
	case <-stop:
		return false
	}
}

// canTakeLocked reports whether committer k may take work now.
func (in *intake) canTakeLocked(k int) bool {
	return len(in.ready) > 0 && (k == 0 || in.readyN >= in.overflowAt)
}

// wakeLocked wakes the first waiting committer that may take the work.
func (in *intake) wakeLocked() {
	for k, w := range in.waiting {
		if w && in.canTakeLocked(k) {
			in.waiting[k] = false
			select {
			case in.wake[k] <- struct{}{}:
			default:
			}
			return
		}
	}
}

// take returns committer k's next batch (at most max submissions, appended
// to dst[:0], which a committer reuses from batch to batch) and the tasks it
// holds until release, waiting for work until ctx ends (then nil). With a
// delay, it waits up to that long after the first submission for more, from
// the tasks it holds and from newly ready ones.
func (in *intake) take(ctx context.Context, k, max int, delay time.Duration, dst []*submission) ([]*submission, []*taskQueue) {
	batch := dst[:0]
	var held []*taskQueue
	in.mu.Lock()
	for !in.canTakeLocked(k) {
		in.waiting[k] = true
		in.mu.Unlock()
		select {
		case <-in.wake[k]:
		case <-ctx.Done():
			in.mu.Lock()
			in.waiting[k] = false
			in.mu.Unlock()
			return nil, nil
		}
		in.mu.Lock()
	}
	batch, held = in.claimLocked(k, batch, held, max)
	in.mu.Unlock()

	if delay > 0 && len(batch) < max {
		timer := time.NewTimer(delay)
		defer timer.Stop()
	wait:
		for len(batch) < max {
			in.mu.Lock()
			in.waiting[k] = true
			in.mu.Unlock()
			select {
			case <-in.wake[k]:
			case <-timer.C:
				break wait
			case <-ctx.Done():
				break wait
			}
			in.mu.Lock()
			batch, held = in.claimLocked(k, batch, held, max)
			in.mu.Unlock()
		}
		in.mu.Lock()
		in.waiting[k] = false
		batch, held = in.claimLocked(k, batch, held, max)
		in.mu.Unlock()
	}
	for range batch {
		<-in.room // never blocks: every queued submission holds a token
	}
	return batch, held
}

// claimLocked adds to batch, up to max: first what arrived for the tasks
// the committer holds, then, if it may take work now, ready tasks, oldest
// first (the last one perhaps in part; the committer holds it anyway).
func (in *intake) claimLocked(k int, batch []*submission, held []*taskQueue, max int) ([]*submission, []*taskQueue) {
	for _, tq := range held {
		n := min(len(tq.subs), max-len(batch))
		batch = append(batch, tq.subs[:n]...)
		tq.subs = shift(tq.subs, n)
	}
	for open := in.canTakeLocked(k); open && len(batch) < max && len(in.ready) > 0; {
		tq := in.ready[0]
		in.ready[0] = nil
		in.ready = in.ready[1:]
		in.readyN -= len(tq.subs)
		tq.ready, tq.taken = false, true
		held = append(held, tq)
		n := min(len(tq.subs), max-len(batch))
		batch = append(batch, tq.subs[:n]...)
		tq.subs = shift(tq.subs, n)
	}
	return batch, held
}

// shift drops the first n of subs, clearing them for the collector.
func shift(subs []*submission, n int) []*submission {
	clear(subs[:n])
	if n == len(subs) {
		return subs[:0]
	}
	return subs[n:]
}

// release gives back the tasks of a committed batch: those with more
// submissions are ready again (at the back), the others are forgotten.
func (in *intake) release(held []*taskQueue) {
	in.mu.Lock()
	for _, tq := range held {
		tq.taken = false
		if len(tq.subs) == 0 {
			delete(in.tasks, tq.id)
			continue
		}
		tq.ready = true
		in.ready = append(in.ready, tq)
		in.readyN += len(tq.subs)
	}
	in.wakeLocked()
	in.mu.Unlock()
}
