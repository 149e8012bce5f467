package codex

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/taskrunner/taskrunner/runner/agent"
	"github.com/taskrunner/taskrunner/runner/proc"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// Defaults of the configuration.
const (
	DefaultModel   = "gpt-5.5"
	DefaultBaseURL = "https://api.openai.com/v1"
	// DefaultRetries is how often the CLI retries a failed model request or stream (like
	// CLAUDE_CODE_MAX_RETRIES=2 for Claude Code: fail fast instead of retrying for minutes).
	DefaultRetries = 2
)

// DefaultPrices are the USD prices per million tokens used when none are configured.
var DefaultPrices = Prices{InputPerMTok: 1.25, CachedInputPerMTok: 0.125, OutputPerMTok: 10}

// Prices is the price table that turns Codex's token counts into a cost (Codex reports none).
type Prices struct {
	InputPerMTok, CachedInputPerMTok, OutputPerMTok float64
}

// Cost prices one turn's usage: uncached input, cached input and output tokens (reasoning
// tokens are part of the output tokens).
func (p Prices) Cost(u Usage) float64 {
	uncached := max(u.InputTokens-u.CachedInputTokens, 0)
	return (float64(uncached)*p.InputPerMTok + float64(u.CachedInputTokens)*p.CachedInputPerMTok +
		float64(u.OutputTokens)*p.OutputPerMTok) / 1e6
}

// Config configures the adapter.
type Config struct {
	// Bin is the codex executable.
	Bin string
	// Dir is the workspace (the CLI's working directory).
	Dir string
	// Home is the per-task CODEX_HOME; the adapter creates it (owned by User) and writes its
	// config.toml. Outside /tmp if possible: the CLI refuses to create its helper binaries
	// under a temporary directory (it only warns).
	Home string
	// Env is the CLI's environment (PATH, HOME, …); CODEX_HOME and OPENAI_API_KEY are set by
	// the adapter.
	Env []string
	// User is who the CLI runs as; nil keeps the runner's identity.
	User *proc.User
	// BaseURL is the Responses API base URL (…/v1); default DefaultBaseURL.
	BaseURL string
	// Model is the model name; default DefaultModel.
	Model string
	// APIKey is passed as OPENAI_API_KEY (empty: whatever Env holds).
	APIKey string
	// Prices price the token usage; zero means DefaultPrices.
	Prices Prices
	// MaxBudgetUSD fails a stage with a limit error once the task's cost reaches it (0: none).
	// Codex reports usage only when a stage ends, so the check runs after every stage.
	MaxBudgetUSD float64
	// Retries is the CLI's request and stream retry count; 0 means DefaultRetries, negative
	// means none.
	Retries int
	// Transcript, when set, receives every stdout line of the CLI unparsed (tests record the
	// real CLI's output with it).
	Transcript func(stage agent.Stage, line []byte)
}

// Adapter runs the stages of one task on one Codex thread.
type Adapter struct {
	cfg Config

	mu        sync.Mutex
	prepared  bool
	threadID  string
	lastUsage Usage // the thread's cumulative usage after the last stage
	lastTotal float64
}

var _ agent.Agent = (*Adapter)(nil)

// New returns an adapter.
func New(cfg Config) *Adapter {
	if cfg.Model == "" {
		cfg.Model = DefaultModel
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultBaseURL
	}
	if cfg.Prices == (Prices{}) {
		cfg.Prices = DefaultPrices
	}
	switch {
	case cfg.Retries == 0:
		cfg.Retries = DefaultRetries
	case cfg.Retries < 0:
		cfg.Retries = 0
	}
	return &Adapter{cfg: cfg}
}

// ThreadID is the Codex thread id, once the first stage started.
func (a *Adapter) ThreadID() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.threadID
}

// Prompt is the prompt of a stage: the OpenSpec skill that `openspec init --tools codex`
// installs under .agents/skills/ (Codex expands `$<skill>` mentions), the equivalent of
// Claude Code's /opsx:<stage> commands.
func Prompt(req agent.StageRequest) (string, error) {
	switch req.Stage {
	case taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE:
		return "$openspec-explore " + req.Prompt, nil
	case taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE:
		return "$openspec-propose " + req.Prompt, nil
	case taskrunnerv1.TaskStage_TASK_STAGE_APPLY:
		return "$openspec-apply-change " + req.Change, nil
	case taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE:
		return "$openspec-archive-change " + req.Change, nil
	}
	return "", fmt.Errorf("codex: unknown stage %v", req.Stage)
}

// Args returns the CLI arguments of one stage; a non-empty thread resumes it.
func Args(prompt, thread string) []string {
	flags := []string{"--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"}
	if thread == "" {
		return append(append([]string{"exec"}, flags...), "--", prompt)
	}
	return append(append([]string{"exec", "resume"}, flags...), "--", thread, prompt)
}

// ConfigTOML is the config.toml of the task's CODEX_HOME: the model provider `local` with the
// base URL and model, approvals and Codex's own sandbox off (the task sandbox is the
// isolation boundary), no login shell (it would reset PATH), no update check, analytics or
// feedback upload.
func (c Config) ConfigTOML() string {
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) } // a JSON string is a TOML basic string
	var b strings.Builder
	fmt.Fprintf(&b, "model = %s\n", q(c.Model))
	b.WriteString(`model_provider = "local"
approval_policy = "never"
sandbox_mode = "danger-full-access"
allow_login_shell = false
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[model_providers.local]
name = "local"
`)
	fmt.Fprintf(&b, "base_url = %s\n", q(c.BaseURL))
	b.WriteString("env_key = \"OPENAI_API_KEY\"\nwire_api = \"responses\"\n")
	fmt.Fprintf(&b, "request_max_retries = %d\nstream_max_retries = %d\n", c.Retries, c.Retries)
	return b.String()
}

// prepare creates CODEX_HOME with its config.toml once.
func (a *Adapter) prepare() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.prepared {
		return nil
	}
	if a.cfg.Home == "" {
		return errors.New("codex: no CODEX_HOME configured")
	}
	if err := os.MkdirAll(a.cfg.Home, 0o700); err != nil {
		return fmt.Errorf("codex: CODEX_HOME: %w", err)
	}
	file := filepath.Join(a.cfg.Home, "config.toml")
	if err := os.WriteFile(file, []byte(a.cfg.ConfigTOML()), 0o600); err != nil {
		return fmt.Errorf("codex: CODEX_HOME: %w", err)
	}
	if err := proc.Chown(a.cfg.Home, a.cfg.User); err != nil {
		return fmt.Errorf("codex: CODEX_HOME: %w", err)
	}
	a.prepared = true
	return nil
}

// env is the CLI's environment: Env with CODEX_HOME and OPENAI_API_KEY set.
func (a *Adapter) env() []string {
	out := make([]string, 0, len(a.cfg.Env)+2)
	for _, kv := range a.cfg.Env {
		if strings.HasPrefix(kv, "CODEX_HOME=") || (a.cfg.APIKey != "" && strings.HasPrefix(kv, "OPENAI_API_KEY=")) {
			continue
		}
		out = append(out, kv)
	}
	out = append(out, "CODEX_HOME="+a.cfg.Home)
	if a.cfg.APIKey != "" {
		out = append(out, "OPENAI_API_KEY="+a.cfg.APIKey)
	}
	return out
}

// RunStage runs one `codex exec` invocation and waits for it. A context that ends kills the
// CLI's process tree; the error is then the context's cause.
func (a *Adapter) RunStage(ctx context.Context, req agent.StageRequest, obs agent.Observer) (agent.Result, error) {
	prompt, err := Prompt(req)
	if err != nil {
		return agent.Result{}, err
	}
	if err := a.prepare(); err != nil {
		return agent.Result{}, err
	}
	a.mu.Lock()
	thread := a.threadID
	a.mu.Unlock()

	st := &stream{dir: a.cfg.Dir, obs: obs}
	cmd := proc.Command(ctx, a.cfg.User, a.cfg.Dir, a.env(), a.cfg.Bin, Args(prompt, thread)...)
	stdout := &agent.LineWriter{Fn: func(b []byte) {
		if a.cfg.Transcript != nil {
			a.cfg.Transcript(req.Stage, b)
		}
		st.line(b)
	}}
	stderr := &agent.LineWriter{Fn: st.stderrLine}
	cmd.Stdout, cmd.Stderr = stdout, stderr // stdin stays nil: /dev/null
	runErr := cmd.Run()
	stdout.Flush()
	stderr.Flush()
	if cmd.Process != nil {
		// Nothing the agent started may outlive its stage.
		proc.KillTree(cmd.Process.Pid)
	}

	st.mu.Lock()
	usage, failed, lastErr, text, threadID, turns := st.usage, st.failed, st.lastError, st.text, st.threadID, st.turns
	st.mu.Unlock()
	res := agent.Result{SessionID: threadID, Text: text, NumTurns: turns}
	a.mu.Lock()
	if a.threadID == "" && threadID != "" {
		a.threadID = threadID
	}
	if res.SessionID == "" {
		res.SessionID = a.threadID
	}
	if usage != nil {
		u := stageUsage(*usage, a.lastUsage)
		a.lastUsage = *usage
		res.Reported = true
		res.TokensIn, res.TokensOut = u.InputTokens, u.OutputTokens
		res.CostUSD = a.cfg.Prices.Cost(u)
		res.TotalCostUSD = a.lastTotal + res.CostUSD
		a.lastTotal = res.TotalCostUSD
		obs.Log(fmt.Sprintf("stage done: %d input tokens (%d cached), %d output tokens, %.4f USD (task %.4f USD)",
			u.InputTokens, u.CachedInputTokens, u.OutputTokens, res.CostUSD, res.TotalCostUSD))
	}
	a.mu.Unlock()

	if ctx.Err() != nil {
		return res, context.Cause(ctx)
	}
	if failed != "" {
		return res, agent.Errorf("codex: turn failed: %s", failed)
	}
	if runErr != nil {
		msg := runErr.Error()
		var exitErr *exec.ExitError
		if errors.As(runErr, &exitErr) {
			msg = fmt.Sprintf("exited with status %d", exitErr.ExitCode())
			if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				msg = fmt.Sprintf("killed by signal %d (%s)", int(ws.Signal()), ws.Signal())
			}
		}
		switch {
		case lastErr != "":
			msg += ": " + lastErr
		case st.stderrTail() != "":
			msg += ": " + st.stderrTail()
		}
		return res, agent.Errorf("codex: %s", msg)
	}
	if usage == nil {
		msg := "exited without completing the turn"
		if lastErr != "" {
			msg += ": " + lastErr
		}
		return res, agent.Errorf("codex: %s", msg)
	}
	if b := a.cfg.MaxBudgetUSD; b > 0 && res.TotalCostUSD >= b {
		return res, &agent.Error{Reason: fmt.Sprintf("codex: budget exceeded (token cost %.4f USD of %.4f USD)", res.TotalCostUSD, b), Limit: true}
	}
	return res, nil
}

// stageUsage is the usage of one stage. A resumed thread's turn.completed reports the
// thread's cumulative usage (observed with codex-cli 0.169.0), so the previous stage's figures
// are subtracted; when any figure went down it is not cumulative after all (a new thread) and
// is taken as is.
func stageUsage(cur, last Usage) Usage {
	if cur.InputTokens < last.InputTokens || cur.CachedInputTokens < last.CachedInputTokens ||
		cur.OutputTokens < last.OutputTokens || cur.ReasoningOutputTokens < last.ReasoningOutputTokens {
		return cur
	}
	return Usage{
		InputTokens: cur.InputTokens - last.InputTokens, CachedInputTokens: cur.CachedInputTokens - last.CachedInputTokens,
		OutputTokens: cur.OutputTokens - last.OutputTokens, ReasoningOutputTokens: cur.ReasoningOutputTokens - last.ReasoningOutputTokens,
	}
}
