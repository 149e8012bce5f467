package sse

import (
	"bytes"
	"encoding/json"
	"strings"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// view is the shape of a stream's messages.
type view int

const (
	// viewFull: every event of the timeline, its eventwire JSON as data and
	// its type name as the event name (GET /v1/tasks/{id}/events).
	viewFull view = iota
	// viewSeed: the seed frontend's contract (the /projects/… paths):
	// stage_change, log, completed and failed with their small JSON bodies.
	viewSeed
)

// Seed frontend event names and bodies.
const (
	seedStageChange = "stage_change"
	seedLog         = "log"
	seedCompleted   = "completed"
	seedFailed      = "failed"
)

type seedStage struct {
	Stage  string `json:"stage"`
	Status string `json:"status"`
}

type seedLogTail struct {
	Tail string `json:"tail"`
}

type seedPR struct {
	PrURL string `json:"prUrl"`
}

type seedReason struct {
	Reason string `json:"reason"`
}

// seedView turns timeline events into the seed contract's messages. It
// keeps what the mapping needs from earlier events: the current stage, and
// the reason of a runner's failed or cancelled event whose status_change
// has not been seen yet.
//
// Mapping (each message carries the event's seq as its id):
//   - stage_change → stage_change {"stage": <stage>, "status": "running"}
//     (stages change only while running);
//   - log → log {"tail": <lines joined with "\n">};
//   - completed → completed {"prUrl": <pr_url>};
//   - status_change → stage_change {"stage": <stage then, "" before the
//     task ran>, "status": <to>}; into failed or cancelled it is followed
//     by failed {"reason": <reason>}, and only that second message carries
//     the id, so a reconnect between the two gets both again;
//   - the runner's failed and cancelled: nothing by themselves (the
//     status_change into failed or cancelled that follows them on the
//     timeline says it, with the reason redacted); on a timeline written
//     before status_change existed they become failed at the stream's end;
//   - diff_stats, usage, queue_position, sandbox and unknown types:
//     nothing.
type seedView struct {
	stage      string // short stage name at the last event seen
	pending    bool   // a runner failed/cancelled awaits its status_change
	pendingWhy string
}

// shortStatus is the lower-case status name without its prefix
// (TASK_STATUS_AWAITING_REVIEW → awaiting_review).
func shortStatus(s taskrunnerv1.TaskStatus) string {
	if s == taskrunnerv1.TaskStatus_TASK_STATUS_UNSPECIFIED {
		return ""
	}
	return strings.ToLower(strings.TrimPrefix(s.String(), "TASK_STATUS_"))
}

// shortStage is the lower-case stage name ("" for none).
func shortStage(s taskrunnerv1.TaskStage) string {
	if s == taskrunnerv1.TaskStage_TASK_STAGE_UNSPECIFIED {
		return ""
	}
	return strings.ToLower(strings.TrimPrefix(s.String(), "TASK_STAGE_"))
}

// seedJSON encodes v without HTML escaping (the body is SSE data, never
// HTML), on one line.
func seedJSON(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // plain structs of strings: cannot fail
	return bytes.TrimSuffix(b.Bytes(), []byte{'\n'})
}

// append renders e; wrote reports whether a message carrying e's seq as its
// id was written.
func (s *seedView) append(dst []byte, e *taskrunnerv1.Event) (out []byte, wrote bool) {
	seq := e.GetSeq()
	frame := seedFrameAt
	switch p := e.GetPayload().(type) {
	case *taskrunnerv1.Event_StageChange:
		s.stage = shortStage(p.StageChange.GetStage())
		return frame(dst, seq, seedStageChange, seedStage{Stage: s.stage, Status: "running"}), true
	case *taskrunnerv1.Event_Log:
		return frame(dst, seq, seedLog, seedLogTail{Tail: strings.Join(p.Log.GetLines(), "\n")}), true
	case *taskrunnerv1.Event_Completed:
		return frame(dst, seq, seedCompleted, seedPR{PrURL: p.Completed.GetPrUrl()}), true
	case *taskrunnerv1.Event_Failed:
		s.pending, s.pendingWhy = true, p.Failed.GetReason()
	case *taskrunnerv1.Event_Cancelled:
		s.pending, s.pendingWhy = true, p.Cancelled.GetReason()
	case *taskrunnerv1.Event_StatusChange:
		sc := p.StatusChange
		stage := s.stage
		switch sc.GetFrom() {
		case taskrunnerv1.TaskStatus_TASK_STATUS_UNSPECIFIED, taskrunnerv1.TaskStatus_TASK_STATUS_PROPOSING, taskrunnerv1.TaskStatus_TASK_STATUS_QUEUED:
			stage = "" // a task has a stage only once it runs
		}
		st := seedStage{Stage: stage, Status: shortStatus(sc.GetTo())}
		switch sc.GetTo() {
		case taskrunnerv1.TaskStatus_TASK_STATUS_FAILED, taskrunnerv1.TaskStatus_TASK_STATUS_CANCELLED:
			why := sc.GetReason()
			if why == "" && s.pending {
				why = s.pendingWhy
			}
			s.pending, s.pendingWhy = false, ""
			dst = frame(dst, 0, seedStageChange, st)
			return frame(dst, seq, seedFailed, seedReason{Reason: why}), true
		}
		return frame(dst, seq, seedStageChange, st), true
	}
	return dst, false
}

// end renders what a stream owes its client when it closes after seq last
// (the last event processed): a runner's failed or cancelled that no
// status_change followed (timelines written before status_change existed),
// and otherwise, when sent (the last id written) is behind last, an id-only
// message so the client's next Last-Event-ID is last.
func (s *seedView) end(dst []byte, last, sent int64) []byte {
	if s.pending {
		s.pending = false
		return seedFrameAt(dst, last, seedFailed, seedReason{Reason: s.pendingWhy})
	}
	if sent < last {
		return appendIDOnly(dst, last)
	}
	return dst
}

func seedFrameAt(dst []byte, seq int64, typ string, v any) []byte {
	dst, _ = appendFrame(dst, seq, typ, seedJSON(v)) // constant names: no error
	return dst
}
