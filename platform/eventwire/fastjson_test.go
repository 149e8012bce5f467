package eventwire

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// protojsonCompact is protojson's form of e without its random whitespace,
// what appendFast must produce byte for byte.
func protojsonCompact(t testing.TB, e *taskrunnerv1.Event, withSeq bool) ([]byte, error) {
	t.Helper()
	seq := e.GetSeq()
	if !withSeq {
		e.Seq = 0
	}
	b, err := marshal.Marshal(e)
	e.Seq = seq
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		t.Fatalf("protojson gave invalid JSON %s: %v", b, err)
	}
	return out.Bytes(), nil
}

func logEvent(lines ...string) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: lines}}}
}

func TestFastJSONIsProtojson(t *testing.T) {
	at := func(secs int64, nanos int32) *timestamppb.Timestamp {
		return &timestamppb.Timestamp{Seconds: secs, Nanos: nanos}
	}
	withTime := func(e *taskrunnerv1.Event, ts *timestamppb.Timestamp) *taskrunnerv1.Event { e.Time = ts; return e }
	cases := map[string]*taskrunnerv1.Event{
		"log":                   {Seq: 7, Time: at(1790000000, 123456789), Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: []string{"a", "b"}, Stage: taskrunnerv1.TaskStage_TASK_STAGE_APPLY}}},
		"log without lines":     {Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Stage: taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE}}},
		"empty log":             logEvent(),
		"log with an empty one": logEvent(""),
		"escapes":               logEvent("quote \" backslash \\ slash / tab\t nl\n cr\r bs\b ff\f nul\x00 unit\x1f del\x7f"),
		"html is not escaped":   logEvent("<script>&amp;</script>"),
		"unicode":               logEvent("héllo → 世界 🎉 \u2028 \u2029 \ufeff"),
		"run and seq":           {Seq: 1 << 40, Run: 3, Payload: &taskrunnerv1.Event_StageChange{StageChange: &taskrunnerv1.StageChange{Stage: taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE, Change: "add-widgets"}}},
		"negative seq":          {Seq: -5, Run: -1, Payload: &taskrunnerv1.Event_StageChange{StageChange: &taskrunnerv1.StageChange{Stage: taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE}}},
		"empty stage change":    {Payload: &taskrunnerv1.Event_StageChange{StageChange: &taskrunnerv1.StageChange{}}},
		"change only":           {Payload: &taskrunnerv1.Event_StageChange{StageChange: &taskrunnerv1.StageChange{Change: "x\"y"}}},
		"diff stats":            {Seq: 9, Payload: &taskrunnerv1.Event_DiffStats{DiffStats: &taskrunnerv1.DiffStats{Additions: 300, Deletions: -2, FilesChanged: 4}}},
		"diff stats, one field": {Payload: &taskrunnerv1.Event_DiffStats{DiffStats: &taskrunnerv1.DiffStats{FilesChanged: 1}}},
		"empty diff stats":      {Payload: &taskrunnerv1.Event_DiffStats{DiffStats: &taskrunnerv1.DiffStats{}}},
		"whole seconds":         withTime(logEvent("x"), at(1790000000, 0)),
		"milliseconds":          withTime(logEvent("x"), at(1790000000, 500000000)),
		"microseconds":          withTime(logEvent("x"), at(1790000000, 123456000)),
		"one nanosecond":        withTime(logEvent("x"), at(0, 1)),
		"last nanosecond":       withTime(logEvent("x"), at(-1, 999999999)),
		"first instant":         withTime(logEvent("x"), at(minTimestampSeconds, 0)),
		"last instant":          withTime(logEvent("x"), at(maxTimestampSeconds, 999999999)),
		"zero time":             withTime(logEvent("x"), at(0, 0)),
	}
	for name, e := range cases {
		t.Run(name, func(t *testing.T) {
			for _, withSeq := range []bool{true, false} {
				want, err := protojsonCompact(t, e, withSeq)
				require.NoError(t, err)
				got, ok := appendFast(nil, e, withSeq)
				require.True(t, ok, "appendFast refused an event it handles")
				require.Equal(t, string(want), string(got))
			}
			enc, err := EncodeEvent(e)
			require.NoError(t, err)
			back, err := DecodeEvent(enc)
			require.NoError(t, err)
			require.Equal(t, e.String(), back.String())
		})
	}
}

// TestFastJSONDefersToProtojson: what appendFast does not handle, it
// leaves alone, and EncodeEvent gives protojson's answer for it.
func TestFastJSONDefersToProtojson(t *testing.T) {
	cases := map[string]struct {
		e       *taskrunnerv1.Event
		encodes bool // protojson can encode it
	}{
		"usage":          {&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Usage{Usage: &taskrunnerv1.Usage{CostUsd: 0.1, TokensIn: 3}}}, true},
		"failed":         {&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Failed{Failed: &taskrunnerv1.Failed{Reason: "r"}}}, true},
		"status change":  {&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_StatusChange{StatusChange: &taskrunnerv1.StatusChange{To: taskrunnerv1.TaskStatus_TASK_STATUS_DONE}}}, true},
		"no payload":     {&taskrunnerv1.Event{Seq: 1}, true},
		"unnamed stage":  {&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_StageChange{StageChange: &taskrunnerv1.StageChange{Stage: 99}}}, true},
		"unnamed in log": {&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Stage: -1}}}, true},
		"bad utf-8":      {logEvent("ok", "bad \xff"), false},
		"too early":      {&taskrunnerv1.Event{Time: &timestamppb.Timestamp{Seconds: minTimestampSeconds - 1}, Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{}}}, false},
		"too late":       {&taskrunnerv1.Event{Time: &timestamppb.Timestamp{Seconds: maxTimestampSeconds + 1}, Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{}}}, false},
		"bad nanos":      {&taskrunnerv1.Event{Time: &timestamppb.Timestamp{Nanos: 1e9}, Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{}}}, false},
		"nil log":        {&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Log{}}, true},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			prefix := []byte("keep")
			got, ok := appendFast(prefix, c.e, true)
			require.False(t, ok)
			require.Equal(t, "keep", string(got))
			enc, err := EncodeEvent(c.e)
			if !c.encodes {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			want, err := protojsonCompact(t, c.e, true)
			require.NoError(t, err)
			var compact bytes.Buffer
			require.NoError(t, json.Compact(&compact, enc))
			require.Equal(t, string(want), compact.String())
		})
	}
}

// FuzzFastJSON: for any log, stage change or diff stats event, appendFast
// gives protojson's bytes (without its random whitespace) or, where
// protojson fails, declines.
func FuzzFastJSON(f *testing.F) {
	f.Add(int64(3), int32(0), int64(1790000000), int32(5), int32(2), "line", "two\n", int64(4), uint8(0))
	f.Add(int64(0), int32(2), int64(-1), int32(999999999), int32(9), "\x00\"\\", "é", int64(-7), uint8(1))
	f.Add(int64(-1), int32(-3), int64(maxTimestampSeconds+1), int32(0), int32(0), "bad \xff", "", int64(0), uint8(2))
	f.Fuzz(func(t *testing.T, seq int64, run int32, secs int64, nanos, stage int32, a, b string, n int64, kind uint8) {
		e := &taskrunnerv1.Event{Seq: seq, Run: run}
		if secs != 0 || nanos != 0 {
			e.Time = &timestamppb.Timestamp{Seconds: secs, Nanos: nanos}
		}
		switch kind % 3 {
		case 0:
			var lines []string
			if a != "" || b != "" {
				lines = []string{a, b}
			}
			e.Payload = &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: lines, Stage: taskrunnerv1.TaskStage(stage)}}
		case 1:
			e.Payload = &taskrunnerv1.Event_StageChange{StageChange: &taskrunnerv1.StageChange{Stage: taskrunnerv1.TaskStage(stage), Change: a + b}}
		default:
			e.Payload = &taskrunnerv1.Event_DiffStats{DiffStats: &taskrunnerv1.DiffStats{Additions: n, Deletions: seq, FilesChanged: int64(stage)}}
		}
		for _, withSeq := range []bool{true, false} {
			want, werr := protojsonCompact(t, e, withSeq)
			got, ok := appendFast(nil, e, withSeq)
			switch {
			case werr != nil && ok:
				t.Fatalf("protojson fails (%v) but appendFast encoded %s", werr, got)
			case werr == nil && ok && !bytes.Equal(want, got):
				t.Fatalf("appendFast differs from protojson:\n%s\n%s", got, want)
			case werr == nil && !ok && (kind%3 == 2 || !unnamed(stage)):
				t.Fatalf("appendFast declined %s", want)
			}
		}
	})
}

// unnamed reports a stage number protojson writes as a number (appendFast
// declines those).
func unnamed(stage int32) bool {
	_, ok := taskrunnerv1.TaskStage_name[stage]
	return !ok
}
