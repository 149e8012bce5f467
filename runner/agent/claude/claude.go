package claude

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/taskrunner/taskrunner/runner/agent"
	"github.com/taskrunner/taskrunner/runner/proc"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// DefaultAllowedTools are the tools the agent may use without asking.
var DefaultAllowedTools = []string{"Read", "Write", "Edit", "MultiEdit", "Bash", "Glob", "Grep", "LS", "TodoWrite"}

// Config configures the adapter.
type Config struct {
	// Bin is the claude executable.
	Bin string
	// Dir is the workspace (the CLI's working directory).
	Dir string
	// Env is the CLI's complete environment (PATH, HOME, ANTHROPIC_*, …).
	Env []string
	// Home is the CLI's HOME, where it keeps its transcripts (default: HOME in Env).
	Home string
	// User is who the CLI runs as; nil keeps the runner's identity.
	User *proc.User
	// MaxTurns is passed as --max-turns to every stage (0: not passed).
	MaxTurns int
	// MaxBudgetUSD is passed as --max-budget-usd (0: not passed).
	MaxBudgetUSD float64
	// AllowedTools defaults to DefaultAllowedTools.
	AllowedTools []string
}

// Adapter runs the stages of one task on one Claude Code conversation.
type Adapter struct {
	cfg Config

	mu        sync.Mutex
	sessionID string
	lastTotal float64
}

var _ agent.Agent = (*Adapter)(nil)

// New returns an adapter.
func New(cfg Config) *Adapter {
	if len(cfg.AllowedTools) == 0 {
		cfg.AllowedTools = DefaultAllowedTools
	}
	return &Adapter{cfg: cfg}
}

// SessionID is the conversation id, once the first stage started.
func (a *Adapter) SessionID() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sessionID
}

// Prompt is the slash command of a stage.
func Prompt(req agent.StageRequest) (string, error) {
	switch req.Stage {
	case taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE:
		return "/opsx:explore " + req.Prompt, nil
	case taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE:
		return "/opsx:propose " + req.Prompt, nil
	case taskrunnerv1.TaskStage_TASK_STAGE_APPLY:
		return "/opsx:apply " + req.Change, nil
	case taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE:
		return "/opsx:archive " + req.Change, nil
	}
	return "", fmt.Errorf("claude: unknown stage %v", req.Stage)
}

// Args returns the CLI arguments of one stage.
func (a *Adapter) Args(prompt, resume string) []string {
	args := []string{"-p", prompt,
		"--output-format", "stream-json", "--verbose",
		"--permission-mode", "bypassPermissions",
		"--allowedTools", strings.Join(a.cfg.AllowedTools, ","),
	}
	if a.cfg.MaxTurns > 0 {
		args = append(args, "--max-turns", strconv.Itoa(a.cfg.MaxTurns))
	}
	if a.cfg.MaxBudgetUSD > 0 {
		args = append(args, "--max-budget-usd", strconv.FormatFloat(a.cfg.MaxBudgetUSD, 'f', -1, 64))
	}
	if resume != "" {
		args = append(args, "--resume", resume)
	}
	return args
}

// RunStage runs one `claude -p` invocation and waits for it. A context that ends kills the
// CLI's process tree; the error is then the context's cause.
func (a *Adapter) RunStage(ctx context.Context, req agent.StageRequest, obs agent.Observer) (agent.Result, error) {
	prompt, err := Prompt(req)
	if err != nil {
		return agent.Result{}, err
	}
	a.mu.Lock()
	resume := a.sessionID
	a.mu.Unlock()

	st := &stream{dir: a.cfg.Dir, obs: obs}
	cmd := proc.Command(ctx, a.cfg.User, a.cfg.Dir, a.cfg.Env, a.cfg.Bin, a.Args(prompt, resume)...)
	stdout := &agent.LineWriter{Fn: st.line}
	stderr := &agent.LineWriter{Fn: st.stderrLine}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	runErr := cmd.Run()
	stdout.Flush()
	stderr.Flush()
	if cmd.Process != nil {
		// Nothing the agent started may outlive its stage.
		proc.KillTree(cmd.Process.Pid)
	}

	res := agent.Result{SessionID: st.sessionID}
	a.mu.Lock()
	if a.sessionID == "" && st.sessionID != "" {
		a.sessionID = st.sessionID
	}
	if r := st.result; r != nil {
		res.Reported = true
		res.TotalCostUSD = r.TotalCostUSD
		res.CostUSD = r.TotalCostUSD - a.lastTotal
		if res.CostUSD < 0 { // not cumulative after all (a new session)
			res.CostUSD = r.TotalCostUSD
			res.TotalCostUSD = a.lastTotal + r.TotalCostUSD
		}
		a.lastTotal = res.TotalCostUSD
		res.TokensIn, res.TokensOut = r.InputTokens, r.OutputTokens
		res.NumTurns = r.NumTurns
		res.Text = r.Text
	}
	a.mu.Unlock()

	if ctx.Err() != nil {
		return res, context.Cause(ctx)
	}
	if r := st.result; r != nil && r.Failed() {
		return res, &agent.Error{Reason: "claude: " + r.Reason(), Limit: r.Limit()}
	}
	if runErr != nil {
		var exitErr interface{ ExitCode() int }
		msg := runErr.Error()
		if errors.As(runErr, &exitErr) {
			msg = fmt.Sprintf("exited with status %d", exitErr.ExitCode())
		}
		if tail := st.stderrTail(); tail != "" {
			msg += ": " + tail
		}
		return res, agent.Errorf("claude: %s", msg)
	}
	if st.result == nil {
		return res, agent.Errorf("claude: exited without a result line")
	}
	return res, nil
}

// stream turns stream-json lines into observations. Calls come from exec's copy goroutines,
// stdout and stderr separately, so the shared parts are locked.
type stream struct {
	dir string
	obs agent.Observer

	mu        sync.Mutex
	sessionID string
	result    *Result
	stderr    []string
}

const (
	maxBlockLines = 20
	maxStderrTail = 10
)

func (s *stream) line(b []byte) {
	if len(bytes.TrimSpace(b)) == 0 {
		return
	}
	m, err := ParseLine(b)
	if err != nil {
		s.obs.Log("malformed agent output: " + agent.Clip(string(b), 200))
		return
	}
	s.mu.Lock()
	if m.SessionID != "" && s.sessionID == "" {
		s.sessionID = m.SessionID
	}
	if m.Result != nil {
		s.result = m.Result
	}
	s.mu.Unlock()
	switch m.Type {
	case "system":
		if m.Subtype == "init" {
			s.obs.Log("agent session " + m.SessionID)
		}
	case "assistant":
		for _, b := range m.Blocks {
			switch b.Type {
			case "text":
				s.obs.Log(agent.LimitLines(b.Text, maxBlockLines)...)
			case "tool_use":
				s.toolUse(b)
			}
		}
	case "user":
		for _, b := range m.Blocks {
			if b.Type != "tool_result" {
				continue
			}
			lines := agent.LimitLines(b.Text, maxBlockLines)
			if b.IsError && len(lines) > 0 {
				lines[0] = "tool error: " + lines[0]
			}
			for i := range lines {
				lines[i] = "  " + lines[i]
			}
			s.obs.Log(lines...)
		}
	case "result":
		r := m.Result
		if r.Failed() {
			s.obs.Log("stage failed: " + agent.Clip(r.Reason(), 500))
		} else {
			s.obs.Log(fmt.Sprintf("stage done: %d turns, session cost %.4f USD", r.NumTurns, r.TotalCostUSD))
		}
	}
}

func (s *stream) toolUse(b Block) {
	if f := b.ToolFile(); f != "" {
		s.obs.Log(fmt.Sprintf("> %s %s", b.Name, s.rel(f)))
		s.obs.FileTouched(s.rel(f))
		return
	}
	if c := b.ToolCommand(); c != "" {
		s.obs.Log("> Bash: " + agent.Clip(agent.FirstLine(c), 300))
		s.obs.Command(c)
		return
	}
	detail := ""
	for _, k := range []string{"file_path", "path", "pattern"} {
		if v, ok := b.Input[k].(string); ok && v != "" {
			detail = " " + s.rel(v)
			break
		}
	}
	s.obs.Log("> " + b.Name + detail)
}

// rel makes a path inside the workspace relative to it.
func (s *stream) rel(p string) string {
	if s.dir != "" && filepath.IsAbs(p) {
		if r, err := filepath.Rel(s.dir, p); err == nil && !strings.HasPrefix(r, "..") {
			return filepath.ToSlash(r)
		}
	}
	return p
}

func (s *stream) stderrLine(b []byte) {
	line := strings.TrimRight(string(b), "\r")
	if strings.TrimSpace(line) == "" {
		return
	}
	s.mu.Lock()
	s.stderr = append(s.stderr, agent.Clip(line, 500))
	if len(s.stderr) > maxStderrTail {
		s.stderr = s.stderr[1:]
	}
	s.mu.Unlock()
	s.obs.Log("stderr: " + line)
}

func (s *stream) stderrTail() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.stderr, " | ")
}
