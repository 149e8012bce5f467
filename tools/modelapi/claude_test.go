package modelapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"io/fs"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// record rewrites testdata/recorded/*.jsonl with the stream-json the real CLI printed:
//
//	go test ./modelapi/ -run TestClaudeCLIDemo -record
var record = flag.Bool("record", os.Getenv("MODELAPI_RECORD") == "1",
	"save the real CLI's stream-json of the demo stages under testdata/recorded/")

// unprivileged is the uid and gid the CLI runs as when the test runs as root: Claude
// Code refuses --permission-mode bypassPermissions as root, and the runner also runs it
// as a non-root user. 65534 is nobody/nogroup on Debian.
const unprivileged = 65534

const (
	demoPrompt = "Add a --farewell flag to greet"
	demoChange = "add-farewell"
)

// findNodeBin walks up from the test's directory to the first node_modules/.bin that
// holds the claude CLI.
func findNodeBin(t *testing.T) string {
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		bin := filepath.Join(dir, "node_modules", ".bin")
		if _, err := os.Stat(filepath.Join(bin, "claude")); err == nil {
			return bin
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

type slogTestWriter struct{ t *testing.T }

func (w slogTestWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// TestClaudeCLIDemo runs the real Claude Code CLI against the server with the demo
// script, on a fresh copy of the demo repository, through the four stages exactly as
// the runner does.
func TestClaudeCLIDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the real Claude Code CLI; skipped with -short")
	}
	nodeBin := findNodeBin(t)
	if nodeBin == "" {
		t.Skip("the claude CLI is not installed: no node_modules/.bin/claude above this directory (run `npm ci` at the repository root)")
	}
	claude := filepath.Join(nodeBin, "claude")
	openspec := filepath.Join(nodeBin, "openspec")
	require.FileExists(t, openspec, "the openspec CLI belongs next to claude")

	script, err := LoadScript("../demo/claude-demo.yaml")
	require.NoError(t, err)
	srv := New(script, slog.New(slog.NewTextHandler(slogTestWriter{t}, nil)))
	hs := httptest.NewServer(srv)
	defer hs.Close()

	// Not t.TempDir: its parent directory is 0700 and the unprivileged CLI could not
	// reach the workspace.
	root, err := os.MkdirTemp("", "modelapi-claude-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	require.NoError(t, os.Chmod(root, 0o755))
	ws := filepath.Join(root, "ws")
	home := filepath.Join(root, "home")
	require.NoError(t, os.Mkdir(home, 0o755))
	copyTree(t, "../demo/sample-repo", ws)

	path := nodeBin + string(os.PathListSeparator) + os.Getenv("PATH")
	baseEnv := []string{"PATH=" + path, "HOME=" + home, "LANG=C.UTF-8"}
	asRoot := os.Geteuid() == 0
	var cred *syscall.SysProcAttr // set once the tree belongs to the unprivileged user
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = ws
		cmd.SysProcAttr = cred
		cmd.Env = append(baseEnv, "GIT_AUTHOR_NAME=test", "GIT_AUTHOR_EMAIL=test@example.com",
			"GIT_COMMITTER_NAME=test", "GIT_COMMITTER_EMAIL=test@example.com")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s %v: %s", name, args, out)
		return string(out)
	}
	// The workspace as the runner leaves it: a clone, then `openspec init` since the
	// repository has no openspec/ directory yet.
	run("git", "init", "-q", "-b", "main")
	run("git", "add", "-A")
	run("git", "commit", "-q", "-m", "initial")
	run(openspec, "init", "--tools", "claude", ".")
	require.FileExists(t, filepath.Join(ws, ".claude/commands/opsx/propose.md"))

	if asRoot {
		chownTree(t, root, unprivileged, unprivileged)
		cred = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: unprivileged, Gid: unprivileged}}
	}

	sessionID := ""
	stage := func(prompt string) []map[string]any {
		t.Helper()
		args := []string{"-p", prompt, "--output-format", "stream-json", "--verbose",
			"--permission-mode", "bypassPermissions", "--allowedTools", "Read,Write,Edit,Bash,Glob,Grep",
			"--max-turns", "20"}
		if sessionID != "" {
			args = append(args, "--resume", sessionID)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, claude, args...)
		cmd.Dir = ws
		cmd.Env = append(baseEnv,
			"ANTHROPIC_BASE_URL="+hs.URL,
			"ANTHROPIC_API_KEY=test",
			"DISABLE_TELEMETRY=1",
			"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
		)
		cmd.SysProcAttr = cred
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		start := time.Now()
		err := cmd.Run()
		t.Logf("%q took %s", prompt, time.Since(start).Round(time.Millisecond))
		require.NoError(t, err, "claude %q failed\nstdout:\n%s\nstderr:\n%s", prompt, stdout.String(), stderr.String())

		lines := parseLines(t, stdout.Bytes())
		require.NotEmpty(t, lines)
		init := lines[0]
		require.Equal(t, "system", init["type"])
		require.Equal(t, "init", init["subtype"])
		require.Equal(t, "bypassPermissions", init["permissionMode"])
		id, _ := init["session_id"].(string)
		require.NotEmpty(t, id)
		if sessionID == "" {
			sessionID = id
		}

		result := lines[len(lines)-1]
		require.Equal(t, "result", result["type"], "last line: %v\nstderr:\n%s", result, stderr.String())
		require.Equal(t, "success", result["subtype"], "result: %v", result)
		require.Equal(t, false, result["is_error"], "result: %v", result)
		cost, ok := result["total_cost_usd"].(float64)
		require.True(t, ok, "total_cost_usd missing: %v", result)
		require.Greater(t, cost, 0.0)

		// Every tool the script asked for ran without an error.
		for _, l := range lines {
			if l["type"] != "user" {
				continue
			}
			for _, b := range contentOf(l) {
				if b["type"] == "tool_result" {
					require.NotEqual(t, true, b["is_error"], "tool failed in %q: %v", prompt, b["content"])
				}
			}
		}
		if *record {
			name := strings.TrimPrefix(strings.Fields(prompt)[0], "/opsx:")
			require.NoError(t, os.MkdirAll("testdata/recorded", 0o755))
			require.NoError(t, os.WriteFile(filepath.Join("testdata/recorded", name+".jsonl"), stdout.Bytes(), 0o644))
		}
		return lines
	}

	// explore: reads the code, answers with text only.
	lines := stage("/opsx:explore " + demoPrompt)
	require.Equal(t, []string{"Read", "Read"}, toolNames(lines))
	change := filepath.Join(ws, "openspec/changes", demoChange)
	require.NoDirExists(t, change)

	// propose: the planning artifacts exist and validate.
	lines = stage("/opsx:propose " + demoPrompt)
	require.Equal(t, []string{"Bash", "Write", "Write", "Write", "Write", "Bash"}, toolNames(lines))
	for _, f := range []string{"proposal.md", "design.md", "tasks.md", "specs/greet/spec.md"} {
		require.FileExists(t, filepath.Join(change, f))
	}
	require.Contains(t, run(openspec, "validate", demoChange), "is valid")
	require.NotContains(t, readFile(t, filepath.Join(ws, "greet")), "farewell", "propose must not touch the code")

	// apply: the code changed, the tasks are checked and the tests pass.
	lines = stage("/opsx:apply " + demoChange)
	require.Contains(t, toolNames(lines), "Edit")
	require.Contains(t, readFile(t, filepath.Join(ws, "greet")), `greeting="Goodbye"`)
	tasks := readFile(t, filepath.Join(change, "tasks.md"))
	require.NotContains(t, tasks, "- [ ]")
	require.Contains(t, tasks, "- [x] 1.3")
	out := run("sh", "test.sh")
	require.Contains(t, out, "ok - greet --farewell Ada")
	require.Contains(t, out, "PASS")
	require.Equal(t, "Goodbye, Ada!\n", run("sh", "greet", "--farewell", "Ada"))

	// archive: the change moved under archive/ and its spec became a main spec.
	stage("/opsx:archive " + demoChange)
	require.NoDirExists(t, change)
	archived, err := filepath.Glob(filepath.Join(ws, "openspec/changes/archive/*-"+demoChange))
	require.NoError(t, err)
	require.Len(t, archived, 1)
	require.FileExists(t, filepath.Join(archived[0], "proposal.md"))
	require.Contains(t, readFile(t, filepath.Join(ws, "openspec/specs/greet/spec.md")), "### Requirement: Farewell flag")

	// Every model request was answered from the script.
	var stages []string
	for _, r := range srv.Requests() {
		if strings.HasPrefix(r.Path, "/v1/messages") && !strings.Contains(r.Path, "count_tokens") {
			require.Equal(t, 200, r.Status, "request %+v", r)
			if len(stages) == 0 || stages[len(stages)-1] != r.Stage {
				stages = append(stages, r.Stage)
			}
		}
	}
	require.Equal(t, []string{"explore", "propose", "apply", "archive"}, stages)
}

func parseLines(t *testing.T, out []byte) []map[string]any {
	t.Helper()
	var lines []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), "line %q", sc.Text())
		lines = append(lines, m)
	}
	require.NoError(t, sc.Err())
	return lines
}

func contentOf(line map[string]any) []map[string]any {
	msg, _ := line["message"].(map[string]any)
	raw, _ := msg["content"].([]any)
	var out []map[string]any
	for _, r := range raw {
		if b, ok := r.(map[string]any); ok {
			out = append(out, b)
		}
	}
	return out
}

// toolNames lists the tools the assistant called, in order.
func toolNames(lines []map[string]any) []string {
	var names []string
	for _, l := range lines {
		if l["type"] != "assistant" {
			continue
		}
		for _, b := range contentOf(l) {
			if b["type"] == "tool_use" {
				names = append(names, b["name"].(string))
			}
		}
	}
	return names
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
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, info.Mode().Perm())
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
	require.NoError(t, err)
}

func chownTree(t *testing.T, root string, uid, gid int) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
	require.NoError(t, err)
}
