package eventsclient

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/taskrunner/taskrunner/platform/redact"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// MaxEventBytes is the largest event the Events service accepts by default, measured the way
// it measures: the event's protojson form with proto field names, as it is stored
// (services/events Config.MaxEventBytes). The server refuses a bigger one with
// InvalidArgument, which ends the stream for good, so the client never sends one.
const MaxEventBytes = 64 << 10

// LogBatchBytes is the JSON budget for the lines of one log event: three quarters of the
// limit, so the envelope (seq, time, stage, field names) and a server configured a little
// tighter still leave room.
const LogBatchBytes = MaxEventBytes * 3 / 4

// maxFieldBytes bounds every string of a non-log event that is over the limit. Reasons are
// already bounded at 1 KiB by their producers; this only stops a bug from ending the stream.
const maxFieldBytes = 4 << 10

// numberedRoom is what numbering adds to an event's JSON at most: "seq" and "run" with
// the longest int64s, quoted as protojson quotes them, with their commas.
const numberedRoom = 2 * len(`"seq":"-9223372036854775808",`)

// minBudget keeps SplitLines meaningful: below it not even the truncation mark fits.
const minBudget = 256

// ErrEventTooLarge is returned by Send for a non-log event that stays over the limit even
// with every string cut to maxFieldBytes. It gets no seq; the client goes on.
var ErrEventTooLarge = errors.New("eventsclient: event larger than the server accepts")

var jsonOpts = protojson.MarshalOptions{UseProtoNames: true}

// SplitLines groups log lines into batches whose JSON form (quoted, escaped, separated) is at
// most budget bytes each, keeping their order. A line too long to fit a batch on its own is
// cut on a rune boundary and ends with "… [truncated N bytes]"; invalid UTF-8 is replaced with
// U+FFFD (proto3 strings must be valid UTF-8, and the server would refuse the event). Every
// other line is passed on unchanged. A budget below 256 counts as 256.
func SplitLines(lines []string, budget int) [][]string {
	budget = max(budget, minBudget)
	var out [][]string
	var cur []string
	size := 0
	for _, l := range lines {
		l = fitLine(l, budget)
		n := lineJSONLen(l)
		if len(cur) > 0 && size+n > budget {
			out = append(out, cur)
			cur, size = nil, 0
		}
		cur = append(cur, l)
		size += n
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// fitLine makes l valid UTF-8 and short enough that its JSON form fits budget.
func fitLine(l string, budget int) string {
	if !utf8.ValidString(l) {
		l = strings.ToValidUTF8(l, "\uFFFD")
	}
	if lineJSONLen(l) <= budget {
		return l
	}
	// Keep the longest start whose JSON fits the budget without the mark, then let
	// TruncateCounted make room for the mark: it removes at least as many bytes as the mark
	// has, each of which cost at least one JSON byte, so the result fits. The loop is a guard.
	keep := jsonPrefix(l, budget-lineJSONLen(""))
	for {
		t := redact.TruncateCounted(l, keep)
		if lineJSONLen(t) <= budget || keep <= 0 {
			return t
		}
		keep--
	}
}

// jsonPrefix returns the longest prefix length of s whose escaped JSON text (without quotes)
// is at most n bytes.
func jsonPrefix(s string, n int) int {
	cost := 0
	for i := 0; i < len(s); i++ {
		cost += jsonByteLen(s[i])
		if cost > n {
			return i
		}
	}
	return len(s)
}

// lineJSONLen is what s adds to a JSON array of strings as protojson writes it: the quoted,
// escaped text, a comma and the space protojson may add after it.
func lineJSONLen(s string) int { return jsonStringLen(s) + 2 }

// jsonStringLen is the length of s as a protojson string, quotes included (protojson escapes
// '"', '\\' and control characters, nothing else).
func jsonStringLen(s string) int {
	n := 2
	for i := 0; i < len(s); i++ {
		n += jsonByteLen(s[i])
	}
	return n
}

// jsonByteLen is what one byte of a valid UTF-8 string costs in protojson.
func jsonByteLen(b byte) int {
	switch {
	case b == '"' || b == '\\' || b == '\b' || b == '\f' || b == '\n' || b == '\r' || b == '\t':
		return 2
	case b < 0x20:
		return 6
	}
	return 1
}

// fitEvent returns ev ready to be numbered: a copy with a time, valid UTF-8 in every string,
// and no bigger than maxBytes. A log event over the limit becomes several log events (same
// time and stage, lines in order); any other event over it has its long strings cut.
func fitEvent(ev *taskrunnerv1.Event, maxBytes int) ([]*taskrunnerv1.Event, error) {
	// The event is measured before it is numbered; the server measures it with its seq and
	// run, which must fit too.
	maxBytes -= numberedRoom
	e := copyFrequent(ev)
	if e == nil {
		e = proto.Clone(ev).(*taskrunnerv1.Event)
		validStrings(e.ProtoReflect())
	}
	if e.Time == nil {
		e.Time = timestamppb.Now()
	}
	if fits(e, maxBytes) {
		return []*taskrunnerv1.Event{e}, nil
	}
	if l := e.GetLog(); l != nil {
		batches := SplitLines(l.GetLines(), maxBytes*3/4)
		out := make([]*taskrunnerv1.Event, 0, len(batches))
		for _, b := range batches {
			out = append(out, &taskrunnerv1.Event{Time: e.Time, Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: b, Stage: l.GetStage()}}})
		}
		return out, nil
	}
	// Halve the bound until the event fits: escapes can make 4 KiB of text 24 KiB of JSON,
	// and a server may be configured with a limit as low as 1 KiB.
	for n := maxFieldBytes; n >= 16; n /= 2 {
		cutStrings(e.ProtoReflect(), n)
		if fits(e, maxBytes) {
			return []*taskrunnerv1.Event{e}, nil
		}
	}
	return nil, fmt.Errorf("%w: %T over %d bytes", ErrEventTooLarge, e.GetPayload(), maxBytes)
}

// copyFrequent is fitEvent's copy of the events a runner sends most (log tails, stage
// changes, diff stats) without reflection, with invalid UTF-8 replaced like validStrings does:
// proto.Clone and the reflective walk of validStrings cost more than the rest of Send. It is
// nil for any other payload and for a message carrying unknown fields, which take the
// general path.
func copyFrequent(ev *taskrunnerv1.Event) *taskrunnerv1.Event {
	if len(ev.ProtoReflect().GetUnknown()) > 0 {
		return nil
	}
	e := &taskrunnerv1.Event{Seq: ev.GetSeq(), Run: ev.GetRun()}
	if t := ev.GetTime(); t != nil {
		if len(t.ProtoReflect().GetUnknown()) > 0 {
			return nil
		}
		e.Time = &timestamppb.Timestamp{Seconds: t.GetSeconds(), Nanos: t.GetNanos()}
	}
	switch p := ev.GetPayload().(type) {
	case *taskrunnerv1.Event_Log:
		if p.Log == nil || len(p.Log.ProtoReflect().GetUnknown()) > 0 {
			return nil
		}
		lines := make([]string, len(p.Log.GetLines()))
		for i, l := range p.Log.GetLines() {
			lines[i] = validUTF8(l)
		}
		e.Payload = &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: lines, Stage: p.Log.GetStage()}}
	case *taskrunnerv1.Event_StageChange:
		if p.StageChange == nil || len(p.StageChange.ProtoReflect().GetUnknown()) > 0 {
			return nil
		}
		e.Payload = &taskrunnerv1.Event_StageChange{StageChange: &taskrunnerv1.StageChange{Stage: p.StageChange.GetStage(), Change: validUTF8(p.StageChange.GetChange())}}
	case *taskrunnerv1.Event_DiffStats:
		if p.DiffStats == nil || len(p.DiffStats.ProtoReflect().GetUnknown()) > 0 {
			return nil
		}
		d := p.DiffStats
		e.Payload = &taskrunnerv1.Event_DiffStats{DiffStats: &taskrunnerv1.DiffStats{Additions: d.GetAdditions(), Deletions: d.GetDeletions(), FilesChanged: d.GetFilesChanged()}}
	default:
		return nil
	}
	return e
}

// validUTF8 is s with invalid UTF-8 replaced by U+FFFD (validStrings' rule).
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// fits reports whether e's JSON form is at most maxBytes. Most events are tiny: when even
// the most escaped JSON the proto size allows fits, no JSON is built.
func fits(e *taskrunnerv1.Event, maxBytes int) bool {
	if sizeBound(e)*6+1024 <= maxBytes || proto.Size(e)*6+1024 <= maxBytes {
		return true
	}
	b, err := jsonOpts.Marshal(e)
	return err == nil && len(b) <= maxBytes
}

// sizeBound is an upper bound of proto.Size(e) for a log event, counted from its lines
// without walking the message (each field's tag and length prefix at their longest), or
// maxInt for any other event, which fits then measures.
func sizeBound(e *taskrunnerv1.Event) int {
	l := e.GetLog()
	if l == nil {
		return math.MaxInt / 8
	}
	n := 64 // seq, run and time at their longest, the log's tag and length, its stage
	for _, line := range l.GetLines() {
		n += len(line) + 6 // tag, length varint (at most 5 bytes), the bytes
	}
	return n
}

// validStrings replaces invalid UTF-8 in every string of m.
func validStrings(m protoreflect.Message) {
	eachString(m, func(s string) (string, bool) {
		if utf8.ValidString(s) {
			return s, false
		}
		return strings.ToValidUTF8(s, "\uFFFD"), true
	})
}

// cutStrings cuts every string of m longer than n bytes.
func cutStrings(m protoreflect.Message, n int) {
	eachString(m, func(s string) (string, bool) {
		if len(s) <= n {
			return s, false
		}
		return redact.TruncateCounted(s, n), true
	})
}

// eachString calls fn on every set string of m, its lists and nested messages, and stores
// the result when fn reports a change.
func eachString(m protoreflect.Message, fn func(string) (string, bool)) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			// Events have no maps; nothing to do.
		case fd.IsList() && fd.Kind() == protoreflect.StringKind:
			l := v.List()
			for i := range l.Len() {
				if s, ok := fn(l.Get(i).String()); ok {
					l.Set(i, protoreflect.ValueOfString(s))
				}
			}
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := range l.Len() {
				eachString(l.Get(i).Message(), fn)
			}
		case fd.Kind() == protoreflect.StringKind:
			if s, ok := fn(v.String()); ok {
				m.Set(fd, protoreflect.ValueOfString(s))
			}
		case fd.Message() != nil:
			eachString(v.Message(), fn)
		}
		return true
	})
}
