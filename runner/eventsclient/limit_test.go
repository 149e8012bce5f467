package eventsclient

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// jsonLinesLen is the JSON size of lines as a protojson array, measured by protojson itself.
func jsonLinesLen(t *testing.T, lines []string) int {
	t.Helper()
	b, err := jsonOpts.Marshal(&taskrunnerv1.Log{Lines: lines})
	require.NoError(t, err)
	empty, err := jsonOpts.Marshal(&taskrunnerv1.Log{Lines: []string{""}})
	require.NoError(t, err)
	return len(b) - len(empty) + 2 // the envelope {"lines":[""]} minus its one empty string
}

// checkSplit asserts SplitLines' contract for lines and budget.
func checkSplit(t *testing.T, lines []string, budget int) {
	t.Helper()
	batches := SplitLines(lines, budget)
	var got []string
	for _, b := range batches {
		require.NotEmpty(t, b, "no empty batch")
		require.LessOrEqual(t, jsonLinesLen(t, b), max(budget, minBudget)+2, "a batch over its budget")
		got = append(got, b...)
	}
	require.Len(t, got, len(lines), "every line, once")
	for i, l := range got {
		require.True(t, utf8.ValidString(l))
		orig := strings.ToValidUTF8(lines[i], "\uFFFD")
		if l == orig {
			continue
		}
		// Only a line too long for a batch of its own is changed, and it says so.
		require.Greater(t, jsonStringLen(orig)+2, max(budget, minBudget), "line %d changed although it fit", i)
		kept, _, ok := strings.Cut(l, "… [truncated ")
		if !ok {
			kept = strings.TrimSuffix(l, "…")
		}
		require.True(t, strings.HasPrefix(orig, kept), "line %d: the kept text is not the line's start", i)
	}
}

func TestSplitLines(t *testing.T) {
	require.Nil(t, SplitLines(nil, LogBatchBytes))
	small := []string{"a", "b", `"quoted"`, ""}
	require.Equal(t, [][]string{small}, SplitLines(small, LogBatchBytes))

	var burst []string
	for i := range 200 {
		burst = append(burst, strings.Repeat(`\"`, 500)+strings.Repeat("x", i))
	}
	batches := SplitLines(burst, LogBatchBytes)
	require.Greater(t, len(batches), 4, "escapes count: 200 lines of 1000+ bytes, 2000+ in JSON")
	checkSplit(t, burst, LogBatchBytes)

	huge := strings.Repeat("\x01", 100_000) // six JSON bytes per byte
	batches = SplitLines([]string{"before", huge, "after"}, LogBatchBytes)
	var flat []string
	for _, b := range batches {
		flat = append(flat, b...)
	}
	require.Len(t, flat, 3)
	require.True(t, strings.HasSuffix(flat[1], " bytes]") && strings.Contains(flat[1], "… [truncated "), "the cut line is marked")
	require.Greater(t, len(flat[1]), LogBatchBytes/6-100, "as much kept as fits")
	checkSplit(t, []string{"before", huge, "after"}, LogBatchBytes)
	checkSplit(t, []string{"\xff\xfe invalid", strings.Repeat("\xff", 70_000)}, LogBatchBytes)
}

func FuzzSplitLines(f *testing.F) {
	f.Add("one\ntwo\nthree", 300)
	f.Add(strings.Repeat(`"\`, 400)+"\n"+strings.Repeat("é", 300), 256)
	f.Add(strings.Repeat("\x00", 2000), 1000)
	f.Add("\xff\xfe\n\xc3", 0)
	f.Add(strings.Repeat("日本語\n", 500), 4096)
	f.Fuzz(func(t *testing.T, text string, budget int) {
		budget %= 1 << 16
		checkSplit(t, strings.Split(text, "\n"), budget)
	})
}

func FuzzFitEvent(f *testing.F) {
	f.Add("line", "reason", 1, 1024)
	f.Add(strings.Repeat(`\"`, 3000), strings.Repeat("\x01", 3000), 40, 4096)
	f.Add("\xff", "\xfe", 3, 2000)
	f.Fuzz(func(t *testing.T, line, reason string, copies, limit int) {
		copies = max(copies%200, 0)
		limit = 1024 + max(limit%(64<<10), 0) // the server's smallest allowed limit and up
		var lines []string
		for range copies {
			lines = append(lines, line)
		}
		for _, ev := range []*taskrunnerv1.Event{
			{Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: lines}}},
			{Payload: &taskrunnerv1.Event_Failed{Failed: &taskrunnerv1.Failed{Reason: reason, PrUrl: line}}},
			{Payload: &taskrunnerv1.Event_StageChange{StageChange: &taskrunnerv1.StageChange{Change: strings.Repeat(reason, copies)}}},
		} {
			evs, err := fitEvent(ev, limit)
			require.NoError(t, err)
			var got []string
			for _, e := range evs {
				e.Seq = 1 << 40
				b, err := jsonOpts.Marshal(e)
				require.NoError(t, err, "every event encodes")
				require.LessOrEqual(t, len(b), limit, "every event is under the limit")
				got = append(got, e.GetLog().GetLines()...)
			}
			if ev.GetLog() != nil {
				require.Len(t, got, len(lines), "no line lost")
			}
		}
	})
}

// fill sets every field of m (recursively for messages, one element for lists) to a
// non-zero value with invalid UTF-8 in its strings, so a field the fast copy forgets shows.
func fill(m protoreflect.Message) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.ContainingOneof() != nil && !fd.ContainingOneof().IsSynthetic() {
			continue // the payload is chosen by the caller
		}
		val := func() protoreflect.Value {
			switch fd.Kind() {
			case protoreflect.StringKind:
				return protoreflect.ValueOfString("x\xffy " + string(fd.Name()))
			case protoreflect.BoolKind:
				return protoreflect.ValueOfBool(true)
			case protoreflect.EnumKind:
				return protoreflect.ValueOfEnum(1)
			case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
				return protoreflect.ValueOfInt32(7)
			case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
				return protoreflect.ValueOfInt64(-7)
			case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
				return protoreflect.ValueOfUint32(7)
			case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
				return protoreflect.ValueOfUint64(7)
			case protoreflect.DoubleKind:
				return protoreflect.ValueOfFloat64(0.5)
			case protoreflect.FloatKind:
				return protoreflect.ValueOfFloat32(0.5)
			case protoreflect.BytesKind:
				return protoreflect.ValueOfBytes([]byte{1})
			}
			return protoreflect.Value{}
		}
		switch {
		case fd.IsList() && fd.Message() == nil:
			l := m.Mutable(fd).List()
			l.Append(val())
			l.Append(val())
		case fd.Message() != nil && !fd.IsList() && !fd.IsMap():
			fill(m.Mutable(fd).Message())
		case !fd.IsList() && !fd.IsMap():
			m.Set(fd, val())
		}
	}
}

// TestCopyFrequentIsCloneAndValidStrings: the reflection-free copy of the frequent events is
// what proto.Clone and validStrings give, for every field those messages have (a field added
// to Event, Log, StageChange, DiffStats or Timestamp fails here until copyFrequent copies it).
func TestCopyFrequentIsCloneAndValidStrings(t *testing.T) {
	for _, payload := range []protoreflect.Message{
		(&taskrunnerv1.Log{}).ProtoReflect(), (&taskrunnerv1.StageChange{}).ProtoReflect(), (&taskrunnerv1.DiffStats{}).ProtoReflect(),
	} {
		ev := &taskrunnerv1.Event{}
		fill(ev.ProtoReflect())
		fill(payload)
		od := ev.ProtoReflect().Descriptor().Oneofs().ByName("payload")
		for i := range od.Fields().Len() {
			if fd := od.Fields().Get(i); fd.Message() != nil && fd.Message().FullName() == payload.Descriptor().FullName() {
				ev.ProtoReflect().Set(fd, protoreflect.ValueOfMessage(payload))
			}
		}
		require.NotNil(t, ev.GetPayload(), "%s is in Event's payload", payload.Descriptor().FullName())
		orig := proto.Clone(ev)
		want := proto.Clone(ev).(*taskrunnerv1.Event)
		validStrings(want.ProtoReflect())
		got := copyFrequent(ev)
		require.NotNil(t, got, "copyFrequent takes %s", payload.Descriptor().FullName())
		require.True(t, proto.Equal(want, got), "copy of %s:\n got %v\nwant %v", payload.Descriptor().FullName(), got, want)
		require.NotSame(t, ev.GetTime(), got.GetTime(), "the copy shares nothing with the sender's event")
		require.True(t, proto.Equal(orig, ev), "the sender's event is left as it was")
	}

	// Everything else takes the general path.
	require.Nil(t, copyFrequent(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Failed{Failed: &taskrunnerv1.Failed{Reason: "r"}}}))
	require.Nil(t, copyFrequent(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Log{}}))
	unknown := &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: []string{"a"}}}}
	unknown.GetLog().ProtoReflect().SetUnknown(protoreflect.RawFields{0x98, 0x06, 0x01}) // field 99, varint 1
	require.Nil(t, copyFrequent(unknown))
	evs, err := fitEvent(unknown, MaxEventBytes)
	require.NoError(t, err)
	require.True(t, proto.Equal(unknown.GetLog(), evs[0].GetLog()), "the general path keeps unknown fields")
}

// TestSizeBoundBoundsProtoSize: the bound fits uses for log events is never below the real
// size, whatever the lines and the other fields.
func TestSizeBoundBoundsProtoSize(t *testing.T) {
	for _, lines := range [][]string{nil, {""}, {"a", "b"}, {strings.Repeat("x", 200)}, {strings.Repeat("y", 70000), "z"}} {
		ev := &taskrunnerv1.Event{Seq: -1, Run: -1, Time: &timestamppb.Timestamp{Seconds: -1 << 62, Nanos: -1},
			Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: lines, Stage: -1}}}
		require.GreaterOrEqual(t, sizeBound(ev), proto.Size(ev))
	}
}
