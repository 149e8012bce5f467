package task

import (
	"github.com/taskrunner/taskrunner/platform/redact"
	"github.com/taskrunner/taskrunner/services/errs"
)

// Advance is one requested transition. Zero fields leave the task unchanged.
type Advance struct {
	// Seq is the event sequence number behind the transition; a Seq at or
	// below the task's LastSeq makes the request a no-op.
	Seq int64
	// RequestID makes non-event transitions idempotent.
	RequestID string

	Status       Status
	Stage        Stage
	Diff         *DiffStats
	Usage        *Usage
	PRURL        string
	PRNumber     int64
	FailedReason string
	Heartbeat    bool

	// Actor and Reason describe a status change on the task's timeline:
	// who decided it and why (FailedReason when Reason is empty).
	Actor  Actor
	Reason string
}

// next lists the legal status moves (ARCHITECTURE.md section 2).
var next = map[Status][]Status{
	StatusProposing:      {StatusQueued, StatusRunning, StatusFailed, StatusCancelled},
	StatusQueued:         {StatusRunning, StatusFailed, StatusCancelled},
	StatusRunning:        {StatusAwaitingReview, StatusFailed, StatusCancelled},
	StatusAwaitingReview: {StatusDone, StatusCancelled, StatusFailed},
}

// CanMove reports whether from → to is a legal status move.
func CanMove(from, to Status) bool {
	for _, s := range next[from] {
		if s == to {
			return true
		}
	}
	return false
}

// MaxReasonBytes bounds failed_reason.
const MaxReasonBytes = 1024

// CleanReason redacts secrets (platform/redact's shapes) and truncates to
// MaxReasonBytes on a rune boundary, marking a cut with "…".
func CleanReason(s string) string {
	return redact.Clean(s, MaxReasonBytes)
}

// Apply returns the task after a, or an ErrInvalidTransition error that names
// the rule it breaks. It does not handle idempotency (see Store.Advance).
// hasSandbox tells whether Dispatch recorded a sandbox, which a move to
// running requires.
func Apply(t Task, a Advance, hasSandbox bool) (Task, error) {
	if t.Status.Terminal() {
		return t, errs.Transition("task %s is %s: no further changes are accepted", t.ID, t.Status)
	}
	if a.Status == "" && a.Stage == "" && a.Diff == nil && a.Usage == nil && a.PRURL == "" && !a.Heartbeat && a.FailedReason == "" {
		return t, errs.Invalid("advance", "nothing to change")
	}
	from := t.Status
	out := t
	if a.Status != "" && a.Status != from {
		if !CanMove(from, a.Status) {
			return t, errs.Transition("task %s cannot move from %s to %s", t.ID, from, a.Status)
		}
		if a.Status == StatusRunning && !hasSandbox {
			return t, errs.Transition("task %s cannot run: it was never dispatched", t.ID)
		}
		out.Status = a.Status
	}
	// Everything the runner reports needs a running task (it may end the
	// task in the same request, e.g. diff stats with completion).
	runnerReport := a.Stage != "" || a.Diff != nil || a.Usage != nil || a.Heartbeat
	if runnerReport && from != StatusRunning && out.Status != StatusRunning {
		return t, errs.Transition("task %s is %s: runner reports are accepted only while running", t.ID, from)
	}
	if a.Stage != "" {
		if a.Stage.Order() == 0 {
			return t, errs.Invalid("stage", "unknown stage %q", a.Stage)
		}
		if a.Stage.Order() <= t.Stage.Order() {
			return t, errs.Transition("task %s stage cannot move from %s to %s: stages only move forward", t.ID, stageName(t.Stage), a.Stage)
		}
		out.Stage = a.Stage
	}
	if a.Diff != nil {
		if a.Diff.Additions < 0 || a.Diff.Deletions < 0 || a.Diff.FilesChanged < 0 {
			return t, errs.Invalid("diff_stats", "must not be negative")
		}
		out.Diff = *a.Diff
	}
	if a.Usage != nil {
		if a.Usage.CostUSD < 0 || a.Usage.TokensIn < 0 || a.Usage.TokensOut < 0 {
			return t, errs.Invalid("usage", "must not be negative")
		}
		out.Usage = *a.Usage
	}
	if a.PRURL != "" {
		if out.Status != StatusAwaitingReview && out.Status != StatusFailed && out.Status != StatusRunning {
			return t, errs.Transition("task %s is %s: a pull request is recorded only when it opens", t.ID, out.Status)
		}
		out.PRURL, out.PRNumber = a.PRURL, a.PRNumber
	}
	if out.Status == StatusAwaitingReview && out.PRURL == "" {
		return t, errs.Transition("task %s cannot await review without a pull request", t.ID)
	}
	if a.FailedReason != "" {
		if out.Status != StatusFailed && out.Status != StatusCancelled {
			return t, errs.Invalid("failed_reason", "only for failed or cancelled tasks")
		}
		out.FailedReason = CleanReason(a.FailedReason)
	}
	return out, nil
}

func stageName(s Stage) string {
	if s == StageNone {
		return "(none)"
	}
	return string(s)
}

// AcceptsLateRunner reports whether a finished task still takes its
// runner's events: a task the control plane failed (deadline, lost
// heartbeat) while its runner was still working, with no pull request
// recorded. The runner may have salvaged its work into a draft pull request
// after the control plane decided (a deadline that passed while the control
// plane was down); its events are stored on the timeline after the final
// status change and the pull request is recorded (RecordPR), but the status
// never changes again.
func AcceptsLateRunner(t Task) bool {
	return t.Status == StatusFailed && t.PRURL == ""
}

// RecordPR is the one change a finished task accepts: the pull request a
// late runner reports (AcceptsLateRunner) on a failed task. seq is the
// runner event's, as for Step. It is an InvalidTransition for any other
// task and an InvalidArgument without a URL.
func RecordPR(t Task, url string, number, seq int64) (Task, error) {
	if url == "" {
		return t, errs.Invalid("pr_url", "must not be empty")
	}
	if !AcceptsLateRunner(t) {
		return t, errs.Transition("task %s is %s: a pull request is recorded late only on a failed task without one", t.ID, t.Status)
	}
	t.PRURL, t.PRNumber = url, number
	t.LastSeq = max(t.LastSeq, seq)
	return t, nil
}
