package codex

import (
	"context"
	"flag"
	"io/fs"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/agent"
	"github.com/taskrunner/taskrunner/tools/modelapi"
)

// record rewrites testdata/recorded/*.jsonl with the JSONL the real Codex CLI printed:
//
//	go test ./agent/codex/ -run TestRealCLIDemo -record
var record = flag.Bool("record", os.Getenv("CODEX_RECORD") == "1",
	"save the real Codex CLI's JSONL of the demo stages under testdata/recorded/")

const (
	demoPrompt = "Add a --farewell flag to greet"
	demoChange = "add-farewell"
	recorded   = "testdata/recorded"
)

var stageNames = map[agent.Stage]string{
	taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE: "explore",
	taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE: "propose",
	taskrunnerv1.TaskStage_TASK_STAGE_APPLY:   "apply",
	taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE: "archive",
}

// nodeBin finds node_modules/.bin with the codex and openspec CLIs above the test.
func nodeBin(t *testing.T) string {
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		bin := filepath.Join(dir, "node_modules", ".bin")
		if _, err := os.Stat(filepath.Join(bin, "codex")); err == nil {
			if _, err := os.Stat(filepath.Join(bin, "openspec")); err == nil {
				return bin
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	if os.Getenv("TASKRUNNER_REQUIRE_AGENTS") == "1" {
		t.Fatal("TASKRUNNER_REQUIRE_AGENTS=1 but the codex and openspec CLIs are not installed (run `npm ci` at the repository root)")
	}
	t.Skip("the codex and openspec CLIs are not installed: no node_modules/.bin above this directory (run `npm ci` at the repository root)")
	return ""
}

type slogTestWriter struct{ t *testing.T }

func (w slogTestWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// TestRealCLIDemo runs the real Codex CLI through the adapter against the scripted Responses
// API with the demo script, on a fresh copy of the demo repository initialised for Codex, and
// checks each stage's effect. With -record it saves each stage's stdout for the parser tests.
func TestRealCLIDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the real Codex CLI; skipped with -short")
	}
	bin := nodeBin(t)
	script, err := modelapi.LoadScript("../../../tools/demo/codex-demo.yaml")
	require.NoError(t, err)
	srv := modelapi.New(script, slog.New(slog.NewTextHandler(slogTestWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})))
	hs := httptest.NewServer(srv)
	defer hs.Close()

	root := t.TempDir()
	ws, home := filepath.Join(root, "ws"), filepath.Join(root, "home")
	require.NoError(t, os.Mkdir(home, 0o755))
	copyTree(t, "../../../tools/demo/sample-repo", ws)
	env := []string{"PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH"), "HOME=" + home, "LANG=C.UTF-8",
		"GIT_AUTHOR_NAME=test", "GIT_AUTHOR_EMAIL=test@example.com", "GIT_COMMITTER_NAME=test", "GIT_COMMITTER_EMAIL=test@example.com"}
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env = ws, env
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s %v: %s", name, args, out)
		return string(out)
	}
	run("git", "init", "-q", "-b", "main")
	run("git", "add", "-A")
	run("git", "commit", "-q", "-m", "initial")
	run(filepath.Join(bin, "openspec"), "init", "--tools", "codex", ".")
	require.FileExists(t, filepath.Join(ws, ".agents/skills/openspec-propose/SKILL.md"))

	var mu sync.Mutex
	transcripts := map[string][]byte{}
	prices := Prices{InputPerMTok: 2, CachedInputPerMTok: 0.5, OutputPerMTok: 8}
	a := New(Config{
		Bin: filepath.Join(bin, "codex"), Dir: ws, Home: filepath.Join(home, ".codex"), Env: env,
		BaseURL: hs.URL + "/v1", APIKey: "sk-test-0123456789", Prices: prices, Retries: -1,
		Transcript: func(stage agent.Stage, line []byte) {
			mu.Lock()
			defer mu.Unlock()
			transcripts[stageNames[stage]] = append(append(transcripts[stageNames[stage]], line...), '\n')
		},
	})
	total := 0.0
	stage := func(stage agent.Stage, change string) (*recordingObserver, agent.Result) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		obs := &recordingObserver{}
		start := time.Now()
		res, err := a.RunStage(ctx, agent.StageRequest{Stage: stage, Prompt: demoPrompt, Change: change}, obs)
		t.Logf("%s took %s", stageNames[stage], time.Since(start).Round(time.Millisecond))
		require.NoError(t, err, "log:\n%s", strings.Join(obs.lines, "\n"))
		require.True(t, res.Reported)
		require.NotEmpty(t, res.SessionID)
		require.Equal(t, 1, res.NumTurns)
		require.Positive(t, res.CostUSD)
		total += res.CostUSD
		require.InDelta(t, total, res.TotalCostUSD, 1e-12)
		for _, l := range obs.lines {
			require.NotContains(t, l, "command failed", "log:\n%s", strings.Join(obs.lines, "\n"))
		}
		if *record {
			mu.Lock()
			b := transcripts[stageNames[stage]]
			mu.Unlock()
			require.NoError(t, os.MkdirAll(recorded, 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(recorded, stageNames[stage]+".jsonl"), b, 0o644))
		}
		return obs, res
	}

	// Per stage: the script's usage per request times the requests (the CLI reports the
	// thread's cumulative usage; the adapter turns it back into the stage's own).
	tokens := func(res agent.Result, requests, in, out int64) {
		t.Helper()
		require.Equal(t, requests*in, res.TokensIn)
		require.Equal(t, requests*out, res.TokensOut)
	}
	obs, res := stage(taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE, "")
	tokens(res, 2, 2400, 180)
	require.InDelta(t, prices.Cost(Usage{InputTokens: 4800, CachedInputTokens: 2400, OutputTokens: 360}), res.CostUSD, 1e-12)
	require.ElementsMatch(t, []string{"cat greet", "cat test.sh"}, obs.commands, "parallel calls run in any order")
	thread := a.ThreadID()
	require.NotEmpty(t, thread)
	change := filepath.Join(ws, "openspec/changes", demoChange)
	require.NoDirExists(t, change)

	obs, res = stage(taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE, "")
	tokens(res, 4, 3100, 900)
	require.Equal(t, thread, a.ThreadID(), "later stages resume the thread")
	for _, f := range []string{"proposal.md", "design.md", "tasks.md", "specs/greet/spec.md"} {
		require.FileExists(t, filepath.Join(change, f))
		require.Contains(t, obs.files, "openspec/changes/add-farewell/"+f, "heredoc targets count as touched files")
	}
	require.Contains(t, run(filepath.Join(bin, "openspec"), "validate", demoChange), "is valid")
	require.NotContains(t, readFile(t, filepath.Join(ws, "greet")), "farewell", "propose must not touch the code")

	obs, res = stage(taskrunnerv1.TaskStage_TASK_STAGE_APPLY, demoChange)
	tokens(res, 4, 4200, 700)
	require.Contains(t, obs.files, "greet", "apply_patch is reported as a file_change")
	require.Contains(t, obs.files, "test.sh")
	require.Contains(t, readFile(t, filepath.Join(ws, "greet")), `greeting="Goodbye"`)
	require.NotContains(t, readFile(t, filepath.Join(change, "tasks.md")), "- [ ]")
	require.Contains(t, run("sh", "test.sh"), "ok - greet --farewell Ada")

	obs, res = stage(taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE, demoChange)
	tokens(res, 2, 2000, 150)
	require.Equal(t, []string{"openspec archive add-farewell -y"}, obs.commands)
	require.NoDirExists(t, change)
	require.Contains(t, readFile(t, filepath.Join(ws, "openspec/specs/greet/spec.md")), "### Requirement: Farewell flag")

	var stages []string
	for _, r := range srv.Requests() {
		if r.Path == "/v1/responses" {
			require.Equal(t, 200, r.Status, "request %+v", r)
			if len(stages) == 0 || stages[len(stages)-1] != r.Stage {
				stages = append(stages, r.Stage)
			}
		}
	}
	require.Equal(t, []string{"explore", "propose", "apply", "archive"}, stages)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, info.Mode().Perm())
	})
	require.NoError(t, err)
}
