package eventwire

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	"google.golang.org/protobuf/encoding/protojson"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// Event type names: task_events.type, SSE event names and TypeName's results.
const (
	TypeStageChange   = "stage_change"
	TypeLog           = "log"
	TypeDiffStats     = "diff_stats"
	TypeUsage         = "usage"
	TypeCompleted     = "completed"
	TypeFailed        = "failed"
	TypeCancelled     = "cancelled"
	TypeStatusChange  = "status_change"
	TypeQueuePosition = "queue_position"
	TypeSandbox       = "sandbox"
)

// Channel is the Redis pub/sub channel carrying a task's committed events:
// <prefix>taskrunner:task:<task-id>:events. Each message is EncodeMessage of
// one event, published only after the event is committed. Messages of one
// task may arrive out of order when different writers commit them (the
// runner's events and the control plane's), so a subscriber that sees a seq
// beyond the next one reads the gap from the database.
func Channel(prefix, taskID string) string {
	return prefix + "taskrunner:task:" + taskID + ":events"
}

// TypeName is the type name of e's payload ("" when it has none).
func TypeName(e *taskrunnerv1.Event) string {
	switch e.GetPayload().(type) {
	case *taskrunnerv1.Event_StageChange:
		return TypeStageChange
	case *taskrunnerv1.Event_Log:
		return TypeLog
	case *taskrunnerv1.Event_DiffStats:
		return TypeDiffStats
	case *taskrunnerv1.Event_Usage:
		return TypeUsage
	case *taskrunnerv1.Event_Completed:
		return TypeCompleted
	case *taskrunnerv1.Event_Failed:
		return TypeFailed
	case *taskrunnerv1.Event_Cancelled:
		return TypeCancelled
	case *taskrunnerv1.Event_StatusChange:
		return TypeStatusChange
	case *taskrunnerv1.Event_QueuePosition:
		return TypeQueuePosition
	case *taskrunnerv1.Event_Sandbox:
		return TypeSandbox
	}
	return ""
}

// RunnerTerminal reports whether e is a runner's last event (completed,
// failed or cancelled): the runner sends nothing after it. It does not end
// the task's timeline: a completed task awaits review, and the status_change
// that the control plane appends follows it.
func RunnerTerminal(e *taskrunnerv1.Event) bool {
	switch TypeName(e) {
	case TypeCompleted, TypeFailed, TypeCancelled:
		return true
	}
	return false
}

// TerminalStatus reports whether st is done, failed or cancelled.
func TerminalStatus(st taskrunnerv1.TaskStatus) bool {
	switch st {
	case taskrunnerv1.TaskStatus_TASK_STATUS_DONE, taskrunnerv1.TaskStatus_TASK_STATUS_FAILED, taskrunnerv1.TaskStatus_TASK_STATUS_CANCELLED:
		return true
	}
	return false
}

// Final reports whether e is the last event of its task's timeline: the
// status_change into done, failed or cancelled. Every stream of a task
// (Subscribe, SSE) ends right after it, and only there.
func Final(e *taskrunnerv1.Event) bool {
	sc := e.GetStatusChange()
	return sc != nil && TerminalStatus(sc.GetTo())
}

// Message is one message on a task's Channel.
type Message struct {
	Seq     int64
	Type    string // TypeName of the event ("" for a payload this version does not know)
	Final   bool   // the event ends the task's timeline (see Final)
	Payload []byte // EncodeEvent's JSON of the event, one line
}

const finalMark = "final"

// EncodeMessage is the wire form of a Channel message: a header line
// "<seq> <type>\n" ("<seq> <type> final\n" for the last event of the
// timeline) and then payload, EncodeEvent's JSON of the event. The header
// lets a subscriber order, route, frame and end streams without parsing the
// JSON: the gateway writes the payload to its SSE clients as it is.
func EncodeMessage(seq int64, typ string, final bool, payload []byte) []byte {
	b := appendHeader(make([]byte, 0, len(payload)+len(typ)+28), seq, typ, final)
	return append(b, payload...)
}

func appendHeader(b []byte, seq int64, typ string, final bool) []byte {
	b = strconv.AppendInt(b, seq, 10)
	b = append(b, ' ')
	b = append(b, typ...)
	if final {
		b = append(b, ' ')
		b = append(b, finalMark...)
	}
	return append(b, '\n')
}

// EncodeMessageBody completes EncodeBody's JSON into the event at seq of
// run (WithSeqRun) and frames it as the Channel message (EncodeMessage),
// in one buffer: msg is the message and payload, the JSON to store, is its
// tail. A writer thus stores and publishes the same bytes, made once. They
// share memory: neither may be modified.
func EncodeMessageBody(seq int64, run int32, typ string, final bool, body []byte) (msg, payload []byte) {
	b := appendHeader(make([]byte, 0, len(body)+len(typ)+64), seq, typ, final)
	head := len(b)
	b = appendWithSeqRun(b, seq, run, body)
	return b, b[head:]
}

// DecodeMessage parses EncodeMessage's output. Payload aliases b.
func DecodeMessage(b []byte) (Message, error) {
	head, payload, ok := bytes.Cut(b, []byte{'\n'})
	seq, rest, ok2 := bytes.Cut(head, []byte{' '})
	if !ok || !ok2 {
		return Message{}, errors.New("eventwire: message without a \"<seq> <type>\" header line")
	}
	n, err := strconv.ParseInt(string(seq), 10, 64)
	if err != nil || n < 1 {
		return Message{}, fmt.Errorf("eventwire: message header has a bad seq %q", seq)
	}
	typ, flag, hasFlag := bytes.Cut(rest, []byte{' '})
	if hasFlag && string(flag) != finalMark {
		return Message{}, fmt.Errorf("eventwire: message header has an unknown flag %q", flag)
	}
	if len(typ) == 0 || bytes.ContainsAny(typ, "\r\n:") {
		return Message{}, fmt.Errorf("eventwire: message header has a bad type %q", typ)
	}
	if len(payload) == 0 {
		return Message{}, errors.New("eventwire: message without an event")
	}
	return Message{Seq: n, Type: string(typ), Final: hasFlag, Payload: payload}, nil
}

var (
	marshal   = protojson.MarshalOptions{UseProtoNames: true}
	unmarshal = protojson.UnmarshalOptions{DiscardUnknown: true}
)

// EncodeEvent is the wire form of an event in Redis messages, in
// task_events.payload and in SSE data: protojson of taskrunnerv1.Event
// (seq, time, payload) with proto field names (stage_change, pr_url), as
// the REST API uses, so a frontend sees one spelling everywhere.
func EncodeEvent(e *taskrunnerv1.Event) ([]byte, error) {
	if b, ok := appendFast(make([]byte, 0, sizeHint(e)), e, true); ok {
		return b, nil
	}
	return marshal.Marshal(e)
}

// EncodeBody is EncodeEvent of e without its seq: the form a writer encodes
// before it knows the event's place on the timeline. WithSeq completes it
// without encoding again.
func EncodeBody(e *taskrunnerv1.Event) ([]byte, error) {
	if b, ok := appendFast(make([]byte, 0, sizeHint(e)), e, false); ok {
		return b, nil
	}
	seq := e.GetSeq()
	e.Seq = 0
	b, err := marshal.Marshal(e)
	e.Seq = seq
	return b, err
}

// sizeHint is room for e's JSON in most cases (appendFast's buffer), and
// for WithSeqRun's additions.
func sizeHint(e *taskrunnerv1.Event) int {
	n := 160
	for _, l := range e.GetLog().GetLines() {
		n += len(l) + 3
	}
	return n
}

// WithSeq returns EncodeBody's JSON with "seq" set, which is what
// EncodeEvent gives for the event at that seq (protojson writes an int64
// as a JSON string; the key order does not matter to any reader, and
// PostgreSQL's jsonb normalises it).
func WithSeq(seq int64, body []byte) []byte { return WithSeqRun(seq, 0, body) }

// WithSeqRun is WithSeq that also sets "run" (the task's run the event
// belongs to) when run > 1, as EncodeEvent would with Event.run set.
func WithSeqRun(seq int64, run int32, body []byte) []byte {
	return appendWithSeqRun(make([]byte, 0, len(body)+36), seq, run, body)
}

func appendWithSeqRun(out []byte, seq int64, run int32, body []byte) []byte {
	out = append(out, `{"seq":"`...)
	out = strconv.AppendInt(out, seq, 10)
	out = append(out, '"')
	if run > 1 {
		out = append(out, `,"run":`...)
		out = strconv.AppendInt(out, int64(run), 10)
	}
	rest := bytes.TrimSpace(body)
	if len(rest) >= 2 && rest[0] == '{' {
		rest = bytes.TrimSpace(rest[1:])
		if len(rest) > 0 && rest[0] != '}' {
			out = append(out, ',')
		}
		return append(out, rest...)
	}
	return append(out, '}')
}

// DecodeEvent parses EncodeEvent's output (or a stored payload).
func DecodeEvent(b []byte) (*taskrunnerv1.Event, error) {
	e := &taskrunnerv1.Event{}
	if err := unmarshal.Unmarshal(b, e); err != nil {
		return nil, fmt.Errorf("eventwire: decode event: %w", err)
	}
	return e, nil
}
