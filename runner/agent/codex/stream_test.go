package codex

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/agent"
)

func readRecorded(t *testing.T, stage string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(recorded, stage+".jsonl"))
	require.NoError(t, err, "the JSONL of the real CLI is recorded by `go test ./agent/codex/ -run TestRealCLIDemo -record`")
	return b
}

// workspaceOf finds the workspace of a recording from the absolute path of a file_change.
func workspaceOf(t *testing.T) string {
	for _, line := range bytes.Split(readRecorded(t, "apply"), []byte("\n")) {
		ev, err := ParseLine(line)
		if err != nil || ev.Item == nil || ev.Item.Type != "file_change" {
			continue
		}
		for _, c := range ev.Item.Changes {
			if strings.HasSuffix(c.Path, "/greet") {
				return strings.TrimSuffix(c.Path, "/greet")
			}
		}
	}
	t.Fatal("the apply recording has no file_change of greet")
	return ""
}

func feed(s *stream, b []byte) {
	for _, line := range bytes.Split(b, []byte("\n")) {
		s.line(line)
	}
}

func TestParseRecorded(t *testing.T) {
	ws := workspaceOf(t)
	cases := []struct {
		stage    string
		files    []string
		commands []string // first lines
		// Cumulative thread usage of the recording's turn.completed.
		usage Usage
		log   []string
	}{
		{
			stage: "explore", commands: []string{"cat greet", "cat test.sh"},
			usage: Usage{InputTokens: 4800, CachedInputTokens: 2400, OutputTokens: 360},
			log:   []string{"> Bash: cat greet", "  #!/bin/sh", "`greet` is a POSIX shell script: it loops over its arguments with a `case`,"},
		},
		{
			stage: "propose",
			files: []string{
				"openspec/changes/add-farewell/proposal.md", "openspec/changes/add-farewell/design.md",
				"openspec/changes/add-farewell/specs/greet/spec.md", "openspec/changes/add-farewell/tasks.md",
			},
			commands: []string{
				"openspec new change add-farewell", "cat > openspec/changes/add-farewell/proposal.md <<'EOF'",
				"cat > openspec/changes/add-farewell/design.md <<'EOF'", "cat > openspec/changes/add-farewell/tasks.md <<'EOF'",
				"mkdir -p openspec/changes/add-farewell/specs/greet && cat > openspec/changes/add-farewell/specs/greet/spec.md <<'EOF'",
				"openspec validate add-farewell",
			},
			usage: Usage{InputTokens: 17200, CachedInputTokens: 10400, OutputTokens: 3960},
			log:   []string{"> Bash: cat > openspec/changes/add-farewell/proposal.md <<'EOF' …", "  Change 'add-farewell' is valid"},
		},
		{
			stage:    "apply",
			files:    []string{"greet", "test.sh", "openspec/changes/add-farewell/tasks.md"},
			commands: []string{"cat openspec/changes/add-farewell/tasks.md", "cat greet", "cat test.sh", `sed -i 's/- \[ \]/- [x]/' openspec/changes/add-farewell/tasks.md && sh test.sh`},
			usage:    Usage{InputTokens: 34000, CachedInputTokens: 22400, OutputTokens: 6760},
			log:      []string{"> Edit greet", "> Edit test.sh", "  ok - greet --farewell Ada", "  PASS"},
		},
		{
			stage: "archive", commands: []string{"openspec archive add-farewell -y"},
			usage: Usage{InputTokens: 38000, CachedInputTokens: 25400, OutputTokens: 7060},
			log:   []string{"> Bash: openspec archive add-farewell -y"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.stage, func(t *testing.T) {
			obs := &recordingObserver{}
			s := &stream{dir: ws, obs: obs}
			feed(s, readRecorded(t, tc.stage))
			require.NotEmpty(t, s.threadID)
			require.Equal(t, 1, s.turns)
			require.NotNil(t, s.usage)
			require.Equal(t, tc.usage, *s.usage)
			require.Empty(t, s.failed)
			require.NotEmpty(t, s.text)
			var first []string // commands by their first line (heredoc bodies left out)
			for _, c := range obs.commands {
				line, _, _ := strings.Cut(c, "\n")
				first = append(first, line)
			}
			require.ElementsMatch(t, tc.commands, first)
			if tc.stage != "apply" {
				require.ElementsMatch(t, tc.files, obs.files)
			} else {
				// sed -i edits in place: only the patch's files and no redirect.
				require.ElementsMatch(t, []string{"greet", "test.sh"}, obs.files)
			}
			for _, l := range tc.log {
				require.Contains(t, obs.lines, l)
			}
			for _, l := range obs.lines {
				require.NotContains(t, l, "malformed")
				require.NotContains(t, l, "command failed")
			}
		})
	}
}

// TestParseRecordedWithNoise feeds a recording with malformed, unknown and truncated lines
// spliced in: they are reported or ignored, and the stage's result is the same.
func TestParseRecordedWithNoise(t *testing.T) {
	ws := workspaceOf(t)
	lines := bytes.Split(bytes.TrimRight(readRecorded(t, "propose"), "\n"), []byte("\n"))
	require.Greater(t, len(lines), 4)
	noisy := [][]byte{lines[0],
		[]byte(`not json at all`),
		[]byte(`{"type":"item.plan.delta","item_id":"x","delta":"step"}`),
		[]byte(`{"type":"item.completed","item":{"id":"i9","type":"collab_tool_call","status":"completed"}}`),
		[]byte(`{"no":"type"}`),
		lines[1][:len(lines[1])/2],
		[]byte(`{"type":"item.started"}`),
		[]byte(`{"type":"request_user_input","id":"q","call_id":"c","questions":[]}`),
		[]byte(""),
	}
	noisy = append(noisy, lines[1:]...)
	obs := &recordingObserver{}
	s := &stream{dir: ws, obs: obs}
	feed(s, bytes.Join(noisy, []byte("\n")))

	clean := &recordingObserver{}
	c := &stream{dir: ws, obs: clean}
	feed(c, readRecorded(t, "propose"))

	require.Equal(t, *c.usage, *s.usage)
	require.Equal(t, c.threadID, s.threadID)
	require.Equal(t, clean.commands, obs.commands)
	require.Equal(t, clean.files, obs.files)
	var malformed []string
	for _, l := range obs.lines {
		if strings.HasPrefix(l, "malformed agent output: ") {
			malformed = append(malformed, l)
		}
	}
	require.Len(t, malformed, 4, "not JSON, no type, a cut line, an item event without an item: %v", malformed)
	require.Contains(t, malformed[0], "not json at all")
}

func TestParseFailures(t *testing.T) {
	obs := &recordingObserver{}
	s := &stream{obs: obs}
	feed(s, []byte(strings.Join([]string{
		`{"type":"thread.started","thread_id":"t1"}`,
		`{"type":"item.completed","item":{"id":"item_0","type":"error","message":"Model metadata for ` + "`x`" + ` not found."}}`,
		`{"type":"turn.started"}`,
		`{"type":"item.completed","item":{"id":"item_1","type":"command_execution","command":"/bin/bash -lc 'false > out.txt'","aggregated_output":"","exit_code":1,"status":"failed"}}`,
		`{"type":"error","message":"Reconnecting... 1/2"}`,
		`{"type":"turn.failed","error":{"message":"stream disconnected before completion: scripted failure"}}`,
	}, "\n")))
	require.Equal(t, "t1", s.threadID)
	require.Nil(t, s.usage)
	require.Equal(t, "stream disconnected before completion: scripted failure", s.failed)
	require.Equal(t, "Reconnecting... 1/2", s.lastError)
	require.Equal(t, []string{"false > out.txt"}, obs.commands)
	require.Empty(t, obs.files, "a failed command wrote nothing we count")
	require.Contains(t, obs.lines, "  command failed (exit status 1)")
	require.Contains(t, obs.lines, "warning: Model metadata for `x` not found.")
	require.Contains(t, obs.lines, "stage failed: stream disconnected before completion: scripted failure")
}

func TestParseLineErrors(t *testing.T) {
	ev, err := ParseLine([]byte(`{"type":"turn.failed","error":{"message":"{\"error\":{\"code\":\"invalid_request_error\",\"message\":\"bad\",\"type\":\"invalid_request_error\"}}\n"}}`))
	require.NoError(t, err)
	require.Equal(t, "invalid_request_error: bad", ev.Message, "a raw error body is shortened")
	ev, err = ParseLine([]byte(`{"type":"error","message":"unexpected status 401 Unauthorized: no"}`))
	require.NoError(t, err)
	require.Equal(t, "unexpected status 401 Unauthorized: no", ev.Message)
	ev, err = ParseLine([]byte(`{"type":"turn.completed"}`))
	require.NoError(t, err)
	require.Equal(t, Usage{}, *ev.Usage)
	ev, err = ParseLine([]byte(`{"type":"something.new","x":1}`))
	require.NoError(t, err)
	require.Equal(t, Event{Type: "something.new"}, ev)
	for _, bad := range []string{``, `[]`, `{"type":""}`, `{"type":"item.completed","item":"x"}`, `{"type":"item.updated"}`} {
		_, err := ParseLine([]byte(bad))
		require.ErrorIs(t, err, ErrMalformed, bad)
	}
}

func TestShellScript(t *testing.T) {
	cases := map[string]string{
		`/bin/bash -lc 'cat greet'`:                           "cat greet",
		`/bin/bash -c "sed -i 's/a/b/' f && sh test.sh"`:      `sed -i 's/a/b/' f && sh test.sh`,
		`/bin/bash -c 'cat > f <<'"'"'EOF'"'"'` + "\nx\nEOF'": "cat > f <<'EOF'\nx\nEOF",
		`bash -lc 'echo it'\''s'`:                             "echo it's",
		`/bin/zsh -lc "echo \"\$HOME\""`:                      `echo "$HOME"`,
		`ls -la`:                                              "ls -la",
		`/bin/bash -lc 'unterminated`:                         `/bin/bash -lc 'unterminated`,
		`/bin/bash -lc 'a' 'b'`:                               `/bin/bash -lc 'a' 'b'`,
	}
	for in, want := range cases {
		require.Equal(t, want, ShellScript(in), in)
	}
}

func TestRedirectTargets(t *testing.T) {
	cases := []struct {
		script string
		want   []string
	}{
		{"cat > openspec/changes/c/proposal.md <<'EOF'\n# P\necho no > nothing\nEOF", []string{"openspec/changes/c/proposal.md"}},
		{"echo a >> log.txt 2>&1 && echo b 2>/dev/null > \"q.txt\"", []string{"log.txt", "q.txt"}},
		{"make 2>&1 | tee -a build.log", []string{"build.log"}},
		{"cat <<-EOF > x\n\tbody > y\n\tEOF\necho >z", []string{"x", "z"}},
		{"grep foo bar >&2; ls > /dev/null", nil},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, RedirectTargets(tc.script), tc.script)
	}
}

func TestStageUsageAndPrices(t *testing.T) {
	p := Prices{InputPerMTok: 2, CachedInputPerMTok: 0.5, OutputPerMTok: 8}
	require.InDelta(t, (600*2+400*0.5+100*8)/1e6, p.Cost(Usage{InputTokens: 1000, CachedInputTokens: 400, OutputTokens: 100, ReasoningOutputTokens: 50}), 1e-15)
	require.Equal(t, Usage{InputTokens: 100, CachedInputTokens: 10, OutputTokens: 5},
		stageUsage(Usage{InputTokens: 300, CachedInputTokens: 30, OutputTokens: 25}, Usage{InputTokens: 200, CachedInputTokens: 20, OutputTokens: 20}))
	require.Equal(t, Usage{InputTokens: 50, OutputTokens: 5}, stageUsage(Usage{InputTokens: 50, OutputTokens: 5}, Usage{InputTokens: 200, OutputTokens: 20}),
		"a smaller figure means a new thread: taken as is")
}

func TestArgsAndConfig(t *testing.T) {
	require.Equal(t, []string{"exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--", "$openspec-explore p"},
		Args("$openspec-explore p", ""))
	require.Equal(t, []string{"exec", "resume", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--", "t-1", "$openspec-apply-change c"},
		Args("$openspec-apply-change c", "t-1"))
	for stage, want := range map[int]string{1: "$openspec-explore p", 2: "$openspec-propose p", 3: "$openspec-apply-change c", 4: "$openspec-archive-change c"} {
		got, err := Prompt(agent.StageRequest{Stage: taskrunnerv1.TaskStage(stage), Prompt: "p", Change: "c"})
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	_, err := Prompt(agent.StageRequest{})
	require.Error(t, err)

	a := New(Config{BaseURL: `http://127.0.0.1:1/v1`, Model: `m"x`})
	toml := a.cfg.ConfigTOML()
	require.Contains(t, toml, "model = \"m\\\"x\"\n")
	require.Contains(t, toml, "base_url = \"http://127.0.0.1:1/v1\"\n")
	require.Contains(t, toml, "allow_login_shell = false\n")
	require.Contains(t, toml, "request_max_retries = 2\n")
	require.Equal(t, DefaultPrices, a.cfg.Prices)
	require.Contains(t, New(Config{Retries: -1}).cfg.ConfigTOML(), "stream_max_retries = 0\n")
}
