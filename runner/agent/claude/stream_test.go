package claude

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/taskrunner/taskrunner/runner/agent"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const recorded = "../../../tools/modelapi/testdata/recorded"

// recordingObserver keeps what the stream reported.
type recordingObserver struct {
	mu       sync.Mutex
	lines    []string
	files    []string
	commands []string
}

func (o *recordingObserver) Log(lines ...string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.lines = append(o.lines, lines...)
}
func (o *recordingObserver) FileTouched(p string) { o.files = append(o.files, p) }
func (o *recordingObserver) Command(c string)     { o.commands = append(o.commands, c) }

func readRecorded(t *testing.T, stage string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(recorded, stage+".jsonl"))
	require.NoError(t, err, "the recorded stream-json of the real CLI lives in tools/modelapi/testdata/recorded")
	return b
}

// workspaceOf returns the cwd of the recording's init line.
func workspaceOf(t *testing.T, b []byte) string {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	s := string(line)
	require.Contains(t, s, `"cwd":"`)
	i := strings.Index(s, `"cwd":"`) + len(`"cwd":"`)
	return s[i : i+strings.IndexByte(s[i:], '"')]
}

func TestParseRecorded(t *testing.T) {
	cases := []struct {
		stage    string
		files    []string
		commands []string
		turns    int
		cost     float64
		in, out  int64
		log      string
	}{
		{stage: "explore", turns: 3, cost: 0.0264, in: 4800, out: 360, log: "> Read greet"},
		{
			stage: "propose", turns: 7, cost: 0.148, in: 12400, out: 3600,
			files: []string{
				"openspec/changes/add-farewell/proposal.md", "openspec/changes/add-farewell/design.md",
				"openspec/changes/add-farewell/specs/greet/spec.md", "openspec/changes/add-farewell/tasks.md",
			},
			commands: []string{"openspec new change add-farewell", "openspec validate add-farewell"},
			log:      "  Change 'add-farewell' is valid",
		},
		{
			stage: "apply", turns: 12, cost: 0.2712, in: 16800, out: 2800,
			files:    []string{"greet", "greet", "greet", "greet", "greet", "test.sh", "openspec/changes/add-farewell/tasks.md"},
			commands: []string{"sh test.sh"},
			log:      "  PASS",
		},
		{stage: "archive", turns: 2, cost: 0.2932, in: 4000, out: 300, commands: []string{"openspec archive add-farewell -y"}, log: "> Bash: openspec archive add-farewell -y"},
	}
	for _, tc := range cases {
		t.Run(tc.stage, func(t *testing.T) {
			b := readRecorded(t, tc.stage)
			// Appended: an unknown type, a malformed line and an empty line; none is fatal.
			b = append(b, []byte("{\"type\":\"rate_limit_event\",\"info\":{}}\n{not json\n\n")...)
			obs := &recordingObserver{}
			st := &stream{dir: workspaceOf(t, b), obs: obs}
			w := &agent.LineWriter{Fn: st.line}
			// Write in odd chunks: lines must be reassembled.
			for len(b) > 0 {
				n := min(777, len(b))
				_, err := w.Write(b[:n])
				require.NoError(t, err)
				b = b[n:]
			}
			w.Flush()

			require.Equal(t, "8a7e2a10-047f-400d-bf99-bdb8791b2b87", st.sessionID)
			require.NotNil(t, st.result)
			require.False(t, st.result.Failed())
			require.Equal(t, tc.turns, st.result.NumTurns)
			require.InDelta(t, tc.cost, st.result.TotalCostUSD, 1e-9)
			require.Equal(t, tc.in, st.result.InputTokens)
			require.Equal(t, tc.out, st.result.OutputTokens)
			require.Equal(t, tc.files, obs.files)
			require.Equal(t, tc.commands, obs.commands)
			require.Contains(t, obs.lines, tc.log)
			require.Contains(t, obs.lines, "malformed agent output: {not json")
			for _, l := range obs.lines {
				require.NotContains(t, l, "rate_limit_event")
			}
		})
	}
}

func TestParseLine(t *testing.T) {
	cases := []struct {
		name    string
		line    string
		wantErr bool
		check   func(t *testing.T, m Message)
	}{
		{name: "not json", line: `{"type":`, wantErr: true},
		{name: "no type", line: `{"foo":1}`, wantErr: true},
		{name: "unknown type", line: `{"type":"stream_event","event":{}}`, check: func(t *testing.T, m Message) {
			require.Equal(t, "stream_event", m.Type)
			require.Nil(t, m.Result)
		}},
		{name: "api error as success subtype", line: `{"type":"result","subtype":"success","is_error":true,"result":"API Error: 500 boom","total_cost_usd":0,"num_turns":1}`,
			check: func(t *testing.T, m Message) {
				require.True(t, m.Result.Failed())
				require.False(t, m.Result.Limit())
				require.Equal(t, "API Error: 500 boom", m.Result.Reason())
			}},
		{name: "turn cap", line: `{"type":"result","subtype":"error_max_turns","is_error":true,"num_turns":3,"total_cost_usd":0.5,"errors":["Reached maximum number of turns (2)"]}`,
			check: func(t *testing.T, m Message) {
				require.True(t, m.Result.Limit())
				require.Contains(t, m.Result.Reason(), "turn cap reached")
				require.Contains(t, m.Result.Reason(), "Reached maximum number of turns (2)")
			}},
		{name: "budget", line: `{"type":"result","subtype":"error_max_budget_usd","is_error":true,"total_cost_usd":1.25}`,
			check: func(t *testing.T, m Message) {
				require.True(t, m.Result.Limit())
				require.Contains(t, m.Result.Reason(), "budget exceeded")
			}},
		{name: "old cost field", line: `{"type":"result","subtype":"success","total_cost":0.25}`, check: func(t *testing.T, m Message) {
			require.InDelta(t, 0.25, m.Result.TotalCostUSD, 1e-12)
		}},
		{name: "tool result blocks", line: `{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t1","is_error":true,"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}}`,
			check: func(t *testing.T, m Message) {
				require.Equal(t, []Block{{Type: "tool_result", ToolUseID: "t1", Text: "a\nb", IsError: true}}, m.Blocks)
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := ParseLine([]byte(tc.line))
			if tc.wantErr {
				require.ErrorIs(t, err, ErrMalformed)
				return
			}
			require.NoError(t, err)
			tc.check(t, m)
		})
	}
}

func TestArgs(t *testing.T) {
	a := New(Config{MaxTurns: 7, MaxBudgetUSD: 1.5})
	require.Equal(t, []string{"-p", "/opsx:apply x", "--output-format", "stream-json", "--verbose",
		"--permission-mode", "bypassPermissions", "--allowedTools", strings.Join(DefaultAllowedTools, ","),
		"--max-turns", "7", "--max-budget-usd", "1.5", "--resume", "sess"}, a.Args("/opsx:apply x", "sess"))
}

// TestStageCostIsADifference runs a fake CLI twice: total_cost_usd is cumulative over the
// resumed session, so the second stage costs the difference.
func TestStageCostIsADifference(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "fake-claude")
	require.NoError(t, os.WriteFile(script, []byte(`#!/bin/sh
case "$*" in
*--resume*) cost=0.75 ;;
*) cost=0.25 ;;
esac
echo '{"type":"system","subtype":"init","session_id":"s1"}'
echo "{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\"num_turns\":1,\"total_cost_usd\":$cost,\"usage\":{\"input_tokens\":10,\"output_tokens\":2}}"
`), 0o755))
	a := New(Config{Bin: script, Dir: dir, Env: []string{"PATH=/usr/bin:/bin"}})
	obs := &recordingObserver{}
	r1, err := a.RunStage(context.Background(), reqFor(1), obs)
	require.NoError(t, err)
	require.InDelta(t, 0.25, r1.CostUSD, 1e-12)
	r2, err := a.RunStage(context.Background(), reqFor(2), obs)
	require.NoError(t, err)
	require.InDelta(t, 0.5, r2.CostUSD, 1e-12)
	require.InDelta(t, 0.75, r2.TotalCostUSD, 1e-12)
	require.Equal(t, "s1", a.SessionID())
	require.EqualValues(t, 10, r2.TokensIn)

	// A CLI that dies without a result line is a failure with its stderr.
	require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\necho 'boom: no credentials' >&2\nexit 3\n"), 0o755))
	_, err = a.RunStage(context.Background(), reqFor(3), obs)
	require.ErrorContains(t, err, "exited with status 3: boom: no credentials")
}
