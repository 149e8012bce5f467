package sse_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/taskrunner/taskrunner/gateway/sse"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// parsed is what a client following the SSE spec's parsing rules (WHATWG
// HTML, "Server-sent events", "Interpreting an event stream") makes of one
// stream: the messages it dispatches (empty data included, so that the test
// sees every blank-line-terminated block) and the fields it saw.
type parsed struct {
	id, event, data string
	hasID, hasData  bool
	unknown         []string // fields other than id, event, data, retry
}

// parseStream splits b at CRLF, CR and LF and interprets every line.
func parseStream(b string) []parsed {
	var out []parsed
	var cur parsed
	var dataBuf strings.Builder
	for len(b) > 0 {
		i := strings.IndexAny(b, "\r\n")
		if i < 0 { // an unterminated last line is discarded by the spec
			break
		}
		line := b[:i]
		if b[i] == '\r' && i+1 < len(b) && b[i+1] == '\n' {
			i++
		}
		b = b[i+1:]
		if line == "" {
			cur.data = strings.TrimSuffix(dataBuf.String(), "\n")
			out = append(out, cur)
			cur, dataBuf = parsed{}, strings.Builder{}
			continue
		}
		if line[0] == ':' {
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "id":
			cur.id, cur.hasID = value, true
		case "event":
			cur.event = value
		case "data":
			dataBuf.WriteString(value)
			dataBuf.WriteByte('\n')
			cur.hasData = true
		case "retry":
		default:
			cur.unknown = append(cur.unknown, field)
		}
	}
	return out
}

func checkFrame(t *testing.T, seq int64, typ string, data []byte) {
	out, err := sse.AppendFrame([]byte("prefix"), seq, typ, data)
	if strings.ContainsAny(typ, "\r\n") {
		require.Error(t, err, "an event name with a line break is refused")
		require.Equal(t, "prefix", string(out), "and nothing is written")
		return
	}
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(out), "prefix"))
	msgs := parseStream(string(out[len("prefix"):]))
	require.Len(t, msgs, 1, "exactly one message, whatever data holds: %q", out)
	m := msgs[0]
	require.Empty(t, m.unknown)
	require.Equal(t, seq > 0, m.hasID)
	if seq > 0 {
		require.Equal(t, strconv.FormatInt(seq, 10), m.id)
	}
	require.Equal(t, typ, m.event)
	require.True(t, m.hasData)
	// Line breaks arrive as LF; every other byte as it was.
	want := strings.ReplaceAll(strings.ReplaceAll(string(data), "\r\n", "\n"), "\r", "\n")
	require.Equal(t, want, m.data)
}

func TestAppendFrame(t *testing.T) {
	out, err := sse.AppendFrame(nil, 7, "log", []byte(`{"seq":"7"}`))
	require.NoError(t, err)
	require.Equal(t, "id: 7\nevent: log\ndata: {\"seq\":\"7\"}\n\n", string(out))
	out, err = sse.AppendFrame(nil, 8, "log", []byte("a\r\nb\rc\nd\n"))
	require.NoError(t, err)
	require.Equal(t, "id: 8\nevent: log\ndata: a\ndata: b\ndata: c\ndata: d\ndata: \n\n", string(out))
	out, err = sse.AppendFrame(nil, 0, "", []byte("x"))
	require.NoError(t, err)
	require.Equal(t, "data: x\n\n", string(out))
	for _, c := range []struct {
		seq  int64
		typ  string
		data string
	}{
		{1, "log", "\n\nid: 99\nevent: completed\ndata: forged\n\n"},
		{2, "stage_change", "\r\r\r"},
		{3, " spaced ", " leading space"},
		{4, "a:b", ": not a comment"},
	} {
		checkFrame(t, c.seq, c.typ, []byte(c.data))
	}
}

func FuzzAppendFrame(f *testing.F) {
	f.Add(int64(1), "log", []byte(`{"seq":"1","log":{"lines":["x"]}}`))
	f.Add(int64(2), "completed", []byte("line one\nline two"))
	f.Add(int64(3), "", []byte("\r\n\r\n"))
	f.Add(int64(0), "status_change", []byte("a\rb\r\nc\n"))
	f.Add(int64(-1), "evil\nevent: x", []byte("data"))
	f.Add(int64(9223372036854775807), ":", []byte("\n\nid: 5\n\n"))
	f.Fuzz(func(t *testing.T, seq int64, typ string, data []byte) {
		checkFrame(t, seq, typ, data)
	})
}

func TestParseLastEventID(t *testing.T) {
	for v, want := range map[string]int64{"": 0, "0": 0, "17": 17, " 17 ": 17, "0042": 42, "9223372036854775807": 1<<63 - 1} {
		n, err := sse.ParseLastEventID(v)
		require.NoError(t, err, v)
		require.Equal(t, want, n, v)
	}
	for _, v := range []string{"-1", "+1", "abc", "1.5", "1e3", " ", "9223372036854775808", "99999999999999999999", "0x10", "1 2"} {
		_, err := sse.ParseLastEventID(v)
		require.Error(t, err, v)
	}
}

func FuzzParseLastEventID(f *testing.F) {
	for _, s := range []string{"", "0", "12", " 12\t", "-3", "+3", "１２", "9223372036854775807", "9223372036854775808", "\x00", "1\n2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		n, err := sse.ParseLastEventID(v)
		trimmed := strings.TrimSpace(v)
		digits := trimmed != "" && strings.Trim(trimmed, "0123456789") == ""
		if err != nil {
			require.Zero(t, n)
			require.True(t, v != "" && (!digits || len(strings.TrimLeft(trimmed, "0")) >= 19), "refused %q", v)
			return
		}
		require.GreaterOrEqual(t, n, int64(0))
		if v == "" {
			require.Zero(t, n)
			return
		}
		require.True(t, digits, "accepted %q", v)
		require.Equal(t, strings.TrimLeft(trimmed, "0"), strings.TrimLeft(strconv.FormatInt(n, 10), "0"))
	})
}

// TestSharedPageRendersOnce: a replay page shared by a connect storm's
// streams renders each event's message once, and it is the message the
// event alone renders to.
func TestSharedPageRendersOnce(t *testing.T) {
	evs := []*taskrunnerv1.Event{
		{Seq: 1, Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: []string{"cloning"}}}},
		{Seq: 2, Payload: &taskrunnerv1.Event_StageChange{StageChange: &taskrunnerv1.StageChange{Stage: taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE}}},
	}
	first, again, alone, err := sse.PageFrames(evs)
	require.NoError(t, err)
	for i := range evs {
		require.Equal(t, string(alone[i]), string(first[i]))
		require.Contains(t, string(first[i]), "id: "+strconv.Itoa(i+1)+"\n")
		require.Same(t, &first[i][0], &again[i][0], "event %d rendered again", i+1)
	}
}
