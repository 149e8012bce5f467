package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/taskrunner/taskrunner/platform/redact"
	"github.com/taskrunner/taskrunner/platform/telemetry"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/agent"
	"github.com/taskrunner/taskrunner/runner/agent/claude"
	"github.com/taskrunner/taskrunner/runner/agent/codex"
	"github.com/taskrunner/taskrunner/runner/config"
	"github.com/taskrunner/taskrunner/runner/eventsclient"
	"github.com/taskrunner/taskrunner/runner/modelproxy"
	"github.com/taskrunner/taskrunner/runner/proc"
	"github.com/taskrunner/taskrunner/runner/repotoken"
	"github.com/taskrunner/taskrunner/runner/rpcretry"
	"github.com/taskrunner/taskrunner/runner/stages"
	"github.com/taskrunner/taskrunner/runner/workspace"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

// Exit statuses.
const (
	exitOK     = 0
	exitFailed = 1
	exitConfig = 2
)

// closeTimeout is the least time given to the Events service to acknowledge the last events;
// with a deadline further away, the runner waits until the deadline (an outage shorter than the
// task's deadline must not lose the task's last events).
const closeTimeout = 30 * time.Second

func main() { os.Exit(run()) }

// run is the runner's life in named steps: configure, trace, stream events, prepare the
// sandbox, run the stages.
func run() int {
	if err := protectSecrets(); err != nil {
		fmt.Fprintln(os.Stderr, "runner: cannot make the process non-dumpable:", err)
		return exitConfig
	}
	r, code := configure()
	if r == nil {
		return code
	}
	// One trace per task: the runner span continues the dispatch trace handed over in
	// TRACEPARENT, and every RPC, git and GitHub call below is its descendant.
	tel, err := telemetry.Setup(context.Background(), "runner")
	if err != nil {
		fmt.Fprintln(os.Stderr, "runner: invalid configuration: OTEL_* variables:", err)
		return exitConfig
	}
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		_ = tel.Shutdown(sctx)
	}()
	base, span := otel.Tracer("github.com/taskrunner/taskrunner/runner").Start(
		telemetry.ContextFromTraceparent(context.Background(), r.cfg.TraceParent), "runner",
		trace.WithAttributes(attribute.String("taskrunner.task_id", r.cfg.TaskID), attribute.String("taskrunner.repo", r.cfg.Repo),
			attribute.String("taskrunner.agent", string(r.cfg.Agent))))
	defer span.End()
	ctx, stopSignals := cancelOnSignal(base)
	defer stopSignals()

	// The work directory comes first so the events client can spill there; a failure to make
	// it is reported once the client runs.
	root, rootErr := workRoot(r.cfg)
	if err := r.startEvents(ctx, root); err != nil {
		fmt.Fprintln(os.Stderr, "runner: events client:", err)
		return exitConfig
	}
	defer r.closeEvents()
	if rootErr != nil {
		return r.failEarly("workdir: " + rootErr.Error())
	}
	opts, failure := r.prepare(root)
	if failure != "" {
		return r.failEarly(failure)
	}
	defer func() { _ = r.tokenConn.Close() }()
	if r.fwd != nil {
		defer func() { _ = r.fwd.Close() }()
	}

	out := stages.Run(ctx, opts)
	r.log.InfoContext(ctx, "runner finished", "status", out.Status.String(), "reason", out.Reason, "pr_url", out.PRURL)
	span.SetAttributes(attribute.String("taskrunner.outcome", out.Status.String()), attribute.String("taskrunner.pr_url", out.PRURL))
	if out.Status == stages.StatusFailed {
		span.SetStatus(codes.Error, out.Reason)
		return exitFailed
	}
	return exitOK
}

// runner is what the steps of run share.
type runner struct {
	cfg       config.Config
	log       *slog.Logger
	red       *redact.Redactor
	tls       *tls.Config
	rpcTel    grpc.DialOption
	events    *eventsclient.Client
	tokenConn *grpc.ClientConn
	fwd       *modelproxy.Forwarder // nil without TASKRUNNER_MODEL_PROXY_ADDR
}

// configure reads the environment: configuration, logger, redactor, client TLS. A nil runner
// comes with the exit status.
func configure() (*runner, int) {
	cfg, err := config.Load(os.Environ())
	if err != nil {
		fmt.Fprintln(os.Stderr, "runner: invalid", err)
		return nil, exitConfig
	}
	level, _ := levelOf(cfg.LogLevel)
	log := slog.New(telemetry.Handler(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))).With("task_id", cfg.TaskID)
	if id := cfg.TraceID(); id != "" && !telemetry.Exporting() {
		log = log.With("trace_id", id) // with an SDK exporting, the handler adds trace and span ids
	}
	patterns, _ := cfg.RedactRegexps()
	red, err := redact.New(patterns)
	if err != nil {
		fmt.Fprintln(os.Stderr, "runner: invalid configuration: TASKRUNNER_REDACT_PATTERNS:", err)
		return nil, exitConfig
	}
	for _, k := range []string{"ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN", "OPENAI_API_KEY"} {
		red.AddLiteral(os.Getenv(k))
	}
	tlsCfg, err := cfg.ClientTLS()
	if err != nil {
		fmt.Fprintln(os.Stderr, "runner: invalid configuration:", err)
		return nil, exitConfig
	}
	return &runner{cfg: cfg, log: log, red: red, tls: tlsCfg, rpcTel: grpc.WithStatsHandler(otelgrpc.NewClientHandler())}, exitOK
}

// cancelOnSignal cancels ctx, as a request to cancel the task, on SIGTERM or SIGINT.
func cancelOnSignal(parent context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(parent)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		select {
		case s := <-sigs:
			cancel(&stages.CancelledError{Reason: "runner received " + s.String()})
		case <-ctx.Done():
		}
	}()
	return ctx, func() { signal.Stop(sigs); cancel(nil) }
}

// workRoot is TASKRUNNER_WORKDIR, or a new temporary directory.
func workRoot(cfg config.Config) (string, error) {
	if cfg.WorkDir != "" {
		return cfg.WorkDir, nil
	}
	return os.MkdirTemp("", "taskrunner-"+cfg.TaskID+"-")
}

// startEvents starts the events stream. Events beyond the in-memory buffer spill to a file
// in root (created only if needed, removed by Close; root is 0755 and the file 0600, so the
// agent user can neither read nor replace it). The stream outlives ctx: a signal cancels the
// task, and the Cancelled event that follows must still be delivered; closeEvents ends it.
func (r *runner) startEvents(ctx context.Context, root string) error {
	events, err := eventsclient.New(eventsclient.Config{
		Addr: r.cfg.EventsAddr, TLS: r.tls.Clone(), TaskID: r.cfg.TaskID, Run: int32(r.cfg.Run), RunnerVersion: version, Logger: r.log,
		SpillDir: root, DialOptions: []grpc.DialOption{r.rpcTel},
	})
	if err != nil {
		return err
	}
	events.Start(context.WithoutCancel(ctx))
	r.events = events
	return nil
}

// closeEvents waits for the last events to be acknowledged: at least closeTimeout, and up to
// the task's deadline when that is later.
func (r *runner) closeEvents() {
	wait := closeTimeout
	if d := r.cfg.DeadlineTime(); !d.IsZero() {
		wait = max(wait, time.Until(d))
	}
	cctx, ccancel := context.WithTimeout(context.Background(), wait)
	defer ccancel()
	if err := r.events.Close(cctx); err != nil {
		r.log.Error("not every event was acknowledged", "err", err)
	}
}

// failEarly reports a setup failure before the stages run.
func (r *runner) failEarly(reason string) int {
	reason = redact.Truncate(r.red.Line(reason), stages.MaxReasonBytes)
	r.log.Error("task failed", "reason", reason)
	_, _ = r.events.Send(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Failed{Failed: &taskrunnerv1.Failed{Reason: reason}}})
	return exitFailed
}

// prepare sets up everything the stages need: the agent user, the directories, the tools, the
// token source and the workspace. A non-empty failure is the reason to report.
func (r *runner) prepare(root string) (opts stages.Options, failure string) {
	cfg := r.cfg
	var user *proc.User
	asRoot := os.Geteuid() == 0
	if asRoot {
		uid, gid, err := cfg.AgentCredential()
		if err != nil {
			return opts, err.Error()
		}
		if uid != 0 {
			user = &proc.User{Uid: uid, Gid: gid, Groups: []uint32{}}
		}
	}
	home, repo, err := stages.PrepareDirs(root, user)
	if err != nil {
		return opts, err.Error()
	}
	agentBinVar, agentBin := "TASKRUNNER_CLAUDE_BIN", cfg.ClaudeBin
	if cfg.Agent == config.AgentCodex {
		agentBinVar, agentBin = "TASKRUNNER_CODEX_BIN", cfg.CodexBin
	}
	agentBin, err = exec.LookPath(agentBin)
	if err != nil {
		return opts, agentBinVar + ": " + err.Error()
	}
	openspecBin, err := exec.LookPath(cfg.OpenSpecBin)
	if err != nil {
		return opts, "TASKRUNNER_OPENSPEC_BIN: " + err.Error()
	}
	agentBin, _ = filepath.Abs(agentBin)
	openspecBin, _ = filepath.Abs(openspecBin)
	extraPath := []string{filepath.Dir(openspecBin), filepath.Dir(agentBin)}

	tokens, err := r.tokenSource()
	if err != nil {
		return opts, "GitHubTokenService: " + err.Error()
	}
	environ := os.Environ()
	ws := workspace.New(workspace.Config{
		Dir: repo, Git: cfg.GitBin, Env: stages.BaseEnv(environ, home, extraPath), User: user,
		TaskID: cfg.TaskID, BaseBranch: cfg.BaseBranch, FollowUp: cfg.Run > 1,
	})
	agentEnv := stages.AgentEnv(environ, home, extraPath, asRoot && user == nil)
	openAIKey := os.Getenv("OPENAI_API_KEY")
	if cfg.ModelProxyAddr != "" {
		fwd, err := r.startModelForwarder()
		if err != nil {
			return opts, "model proxy forwarder: " + err.Error()
		}
		agentEnv = fwd.AgentEnv(agentEnv)
		cfg.CodexBaseURL, openAIKey = fwd.OpenAIBaseURL(), modelproxy.DummyKey
		// The control plane meters usage and enforces the budget outside the sandbox; the
		// CLIs' own budget checks (priced differently) would only stop the task early.
		cfg.MaxBudgetUSD = 0
	}
	ag := newAgent(cfg, agentBin, repo, home, agentEnv, user, openAIKey)
	if r.fwd != nil {
		ag = modelproxy.Guard(ag, r.fwd)
	}
	return stages.Options{
		Task: stages.Task{
			ID: cfg.TaskID, Repo: cfg.Repo, BaseBranch: cfg.BaseBranch, Prompt: cfg.Prompt,
			TraceParent: cfg.TraceParent, Deadline: cfg.DeadlineTime(), MaxBudgetUSD: cfg.MaxBudgetUSD,
			Run: cfg.Run, Followup: cfg.FollowupPrompt, PRNumber: cfg.PRNumber, PRURL: cfg.PRURL,
			ConsoleURL: cfg.ConsoleURL, TraceURLTemplate: cfg.TraceURLTemplate,
		},
		Sessions: r.events,
		Reporter: r.events, Tokens: tokens, Agent: ag, MeteredOutside: r.fwd != nil,
		Workspace: ws, OpenSpecBin: openspecBin, OpenSpecTool: cfg.Agent, Redactor: r.red, Logger: r.log,
	}, ""
}

// startModelForwarder starts the loopback forwarder to the control plane's model proxy, with
// the task certificate (the server name as for the other control-plane calls, else the proxy's
// host).
func (r *runner) startModelForwarder() (*modelproxy.Forwarder, error) {
	tlsCfg := r.tls.Clone()
	if r.cfg.ServerName == "" {
		if host, _, err := net.SplitHostPort(r.cfg.ModelProxyAddr); err == nil {
			tlsCfg.ServerName = host
		}
	}
	fwd, err := modelproxy.Start(r.cfg.ModelProxyAddr, tlsCfg, r.log)
	if err != nil {
		return nil, err
	}
	r.fwd = fwd
	r.log.Info("model calls go through the control plane's model proxy", "proxy", r.cfg.ModelProxyAddr, "forwarder", fwd.URL())
	return fwd, nil
}

// tokenSource dials GitHubTokenService (grpc-go's reconnects bounded like the retries) and
// returns the cached, retrying token source; every new token is registered for redaction.
func (r *runner) tokenSource() (repotoken.Source, error) {
	conn, err := grpc.NewClient(r.cfg.TokenAddr, grpc.WithTransportCredentials(credentials.NewTLS(r.tls.Clone())), r.rpcTel,
		rpcretry.DialOption(0, 0))
	if err != nil {
		return nil, err
	}
	r.tokenConn = conn
	// otelgrpc propagates the trace context; no explicit traceparent needed.
	src := repotoken.NewGRPC(conn, r.cfg.TaskID, "")
	src.Logger = r.log
	return repotoken.NewCached(src, nil, func(t repotoken.Token) { r.red.AddLiteral(t.Value) }), nil
}

// newAgent builds the adapter TASKRUNNER_AGENT names.
func newAgent(cfg config.Config, bin, repo, home string, env []string, user *proc.User, openAIKey string) agent.Agent {
	if cfg.Agent != config.AgentCodex {
		return claude.New(claude.Config{
			Bin: bin, Dir: repo, Env: env, Home: home,
			User: user, MaxTurns: cfg.MaxTurns, MaxBudgetUSD: cfg.MaxBudgetUSD,
		})
	}
	codexHome := cfg.CodexHome
	if codexHome == "" {
		codexHome = filepath.Join(home, ".codex")
	}
	return codex.New(codex.Config{
		Bin: bin, Dir: repo, Home: codexHome, Env: env, User: user,
		BaseURL: cfg.CodexBaseURL, Model: cfg.CodexModel, APIKey: openAIKey,
		Prices: codex.Prices{
			InputPerMTok: cfg.CodexPriceInputPerMTok, CachedInputPerMTok: cfg.CodexPriceCachedInputPerMTok,
			OutputPerMTok: cfg.CodexPriceOutputPerMTok,
		},
		MaxBudgetUSD: cfg.MaxBudgetUSD,
	})
}

func levelOf(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}
