package events

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
	TypeStageChange = "stage_change"
	TypeLog         = "log"
	TypeDiffStats   = "diff_stats"
	TypeUsage       = "usage"
	TypeCompleted   = "completed"
	TypeFailed      = "failed"
	TypeCancelled   = "cancelled"
)

// Channel is the Redis pub/sub channel carrying a task's committed events:
// <prefix>taskrunner:task:<task-id>:events. Each message is EncodeMessage of
// one event, published only after the event is committed, in seq order per
// task.
func Channel(prefix, taskID string) string {
	return prefix + "taskrunner:task:" + taskID + ":events"
}

// CancelChannel is the Redis pub/sub channel that asks whichever replica holds
// a task's runner stream to push Cancel: <prefix>taskrunner:task:<task-id>:cancel.
// The message is the reason as plain UTF-8 text.
func CancelChannel(prefix, taskID string) string {
	return prefix + "taskrunner:task:" + taskID + ":cancel"
}

// cancelPattern matches every CancelChannel of a prefix (PSUBSCRIBE).
func cancelPattern(prefix string) string {
	return prefix + "taskrunner:task:*:cancel"
}

// taskFromCancelChannel extracts the task id from a CancelChannel name.
func taskFromCancelChannel(prefix, channel string) (string, bool) {
	head := prefix + "taskrunner:task:"
	const tail = ":cancel"
	if len(channel) <= len(head)+len(tail) || channel[:len(head)] != head || channel[len(channel)-len(tail):] != tail {
		return "", false
	}
	return channel[len(head) : len(channel)-len(tail)], true
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
	}
	return ""
}

// IsTerminal reports whether e is the last event of its task (completed,
// failed or cancelled): a stream of the task's events ends after it.
func IsTerminal(e *taskrunnerv1.Event) bool { return terminalType(TypeName(e)) }

func terminalType(typ string) bool {
	switch typ {
	case TypeCompleted, TypeFailed, TypeCancelled:
		return true
	}
	return false
}

// Message is one message on a task's Channel.
type Message struct {
	Seq     int64
	Type    string // TypeName of the event ("" for a payload this version does not know)
	Payload []byte // EncodeEvent's JSON of the event, one line
}

// Terminal reports whether the message's event ends its task's stream.
func (m Message) Terminal() bool { return terminalType(m.Type) }

// EncodeMessage is the wire form of a Channel message: a header line
// "<seq> <type>\n" and then payload, EncodeEvent's JSON of the event. The
// header lets a subscriber order, route and frame events without parsing
// the JSON: the gateway writes the payload to its SSE clients as it is.
func EncodeMessage(seq int64, typ string, payload []byte) []byte {
	b := make([]byte, 0, len(payload)+len(typ)+22)
	b = strconv.AppendInt(b, seq, 10)
	b = append(b, ' ')
	b = append(b, typ...)
	b = append(b, '\n')
	return append(b, payload...)
}

// DecodeMessage parses EncodeMessage's output. Payload aliases b.
func DecodeMessage(b []byte) (Message, error) {
	head, payload, ok := bytes.Cut(b, []byte{'\n'})
	seq, typ, ok2 := bytes.Cut(head, []byte{' '})
	if !ok || !ok2 {
		return Message{}, errors.New("events: message without a \"<seq> <type>\" header line")
	}
	n, err := strconv.ParseInt(string(seq), 10, 64)
	if err != nil || n < 1 {
		return Message{}, fmt.Errorf("events: message header has a bad seq %q", seq)
	}
	if len(payload) == 0 {
		return Message{}, errors.New("events: message without an event")
	}
	return Message{Seq: n, Type: string(typ), Payload: payload}, nil
}

// EncodeEvent is the wire form of an event in Redis messages and in
// task_events.payload: protojson of taskrunnerv1.Event (seq, time, payload).
func EncodeEvent(e *taskrunnerv1.Event) ([]byte, error) {
	// Proto field names (stage_change, pr_url), as the REST API uses, so a
	// frontend sees one spelling in resources, SSE data and stored events.
	return protojson.MarshalOptions{UseProtoNames: true}.Marshal(e)
}

// DecodeEvent parses EncodeEvent's output (or a stored payload).
func DecodeEvent(b []byte) (*taskrunnerv1.Event, error) {
	e := &taskrunnerv1.Event{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, e); err != nil {
		return nil, fmt.Errorf("events: decode event: %w", err)
	}
	return e, nil
}
