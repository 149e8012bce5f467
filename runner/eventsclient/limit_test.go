package eventsclient

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

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
