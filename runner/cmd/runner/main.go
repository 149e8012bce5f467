package main

import (
	"context"
	"fmt"
	"log/slog"
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

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/agent"
	"github.com/taskrunner/taskrunner/runner/agent/claude"
	"github.com/taskrunner/taskrunner/runner/agent/codex"
	"github.com/taskrunner/taskrunner/runner/config"
	"github.com/taskrunner/taskrunner/runner/eventsclient"
	"github.com/taskrunner/taskrunner/runner/proc"
	"github.com/taskrunner/taskrunner/runner/redact"
	"github.com/taskrunner/taskrunner/runner/repotoken"
	"github.com/taskrunner/taskrunner/runner/stages"
	"github.com/taskrunner/taskrunner/runner/workspace"
	"github.com/taskrunner/taskrunner/services/telemetry"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

// Exit statuses.
const (
	exitOK     = 0
	exitFailed = 1
	exitConfig = 2
)

// closeTimeout bounds waiting for the Events service to acknowledge the last events.
const closeTimeout = 30 * time.Second

func main() { os.Exit(run()) }

func run() int {
	if err := protectSecrets(); err != nil {
		fmt.Fprintln(os.Stderr, "runner: cannot make the process non-dumpable:", err)
		return exitConfig
	}
	cfg, err := config.Load(os.Environ())
	if err != nil {
		fmt.Fprintln(os.Stderr, "runner: invalid", err)
		return exitConfig
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
		return exitConfig
	}
	for _, k := range []string{"ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN", "OPENAI_API_KEY"} {
		red.AddLiteral(os.Getenv(k))
	}
	tlsCfg, err := cfg.ClientTLS()
	if err != nil {
		fmt.Fprintln(os.Stderr, "runner: invalid configuration:", err)
		return exitConfig
	}

	// One trace per task: the runner span continues the dispatch trace
	// handed over in TRACEPARENT, and every RPC, git and GitHub call below
	// is its descendant.
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
		telemetry.ContextFromTraceparent(context.Background(), cfg.TraceParent), "runner",
		trace.WithAttributes(attribute.String("taskrunner.task_id", cfg.TaskID), attribute.String("taskrunner.repo", cfg.Repo),
			attribute.String("taskrunner.agent", string(cfg.Agent))))
	defer span.End()
	ctx, cancel := context.WithCancelCause(base)
	defer cancel(nil)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	go func() {
		select {
		case s := <-sigs:
			cancel(&stages.CancelledError{Reason: "runner received " + s.String()})
		case <-ctx.Done():
		}
	}()

	rpcTel := grpc.WithStatsHandler(otelgrpc.NewClientHandler())
	events, err := eventsclient.New(eventsclient.Config{
		Addr: cfg.EventsAddr, TLS: tlsCfg.Clone(), TaskID: cfg.TaskID, RunnerVersion: version, Logger: log,
		DialOptions: []grpc.DialOption{rpcTel},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "runner: events client:", err)
		return exitConfig
	}
	events.Start(ctx)
	defer func() {
		cctx, ccancel := context.WithTimeout(context.Background(), closeTimeout)
		defer ccancel()
		if err := events.Close(cctx); err != nil {
			log.Error("not every event was acknowledged", "err", err)
		}
	}()
	// failEarly reports a setup failure before the stages run.
	failEarly := func(reason string) int {
		reason = redact.Truncate(red.Line(reason), stages.MaxReasonBytes)
		log.Error("task failed", "reason", reason)
		_, _ = events.Send(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Failed{Failed: &taskrunnerv1.Failed{Reason: reason}}})
		return exitFailed
	}

	var user *proc.User
	asRoot := os.Geteuid() == 0
	if asRoot {
		uid, gid, err := cfg.AgentCredential()
		if err != nil {
			return failEarly(err.Error())
		}
		if uid != 0 {
			user = &proc.User{Uid: uid, Gid: gid, Groups: []uint32{}}
		}
	}
	root := cfg.WorkDir
	if root == "" {
		if root, err = os.MkdirTemp("", "taskrunner-"+cfg.TaskID+"-"); err != nil {
			return failEarly("workdir: " + err.Error())
		}
	}
	home, repo, err := stages.PrepareDirs(root, user)
	if err != nil {
		return failEarly(err.Error())
	}
	agentBinVar, agentBin := "TASKRUNNER_CLAUDE_BIN", cfg.ClaudeBin
	if cfg.Agent == config.AgentCodex {
		agentBinVar, agentBin = "TASKRUNNER_CODEX_BIN", cfg.CodexBin
	}
	agentBin, err = exec.LookPath(agentBin)
	if err != nil {
		return failEarly(agentBinVar + ": " + err.Error())
	}
	openspecBin, err := exec.LookPath(cfg.OpenSpecBin)
	if err != nil {
		return failEarly("TASKRUNNER_OPENSPEC_BIN: " + err.Error())
	}
	agentBin, _ = filepath.Abs(agentBin)
	openspecBin, _ = filepath.Abs(openspecBin)
	extraPath := []string{filepath.Dir(openspecBin), filepath.Dir(agentBin)}

	conn, err := grpc.NewClient(cfg.TokenAddr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg.Clone())), rpcTel)
	if err != nil {
		return failEarly("GitHubTokenService: " + err.Error())
	}
	defer conn.Close()
	// otelgrpc propagates the trace context; no explicit traceparent needed.
	tokens := repotoken.NewCached(repotoken.NewGRPC(conn, cfg.TaskID, ""), nil,
		func(t repotoken.Token) { red.AddLiteral(t.Value) })

	environ := os.Environ()
	ws := workspace.New(workspace.Config{
		Dir: repo, Git: cfg.GitBin, Env: stages.BaseEnv(environ, home, extraPath), User: user,
		TaskID: cfg.TaskID, BaseBranch: cfg.BaseBranch,
	})
	agentEnv := stages.AgentEnv(environ, home, extraPath, asRoot && user == nil)
	runAgent := newAgent(cfg, agentBin, repo, home, agentEnv, user, os.Getenv("OPENAI_API_KEY"))
	out := stages.Run(ctx, stages.Options{
		Task: stages.Task{
			ID: cfg.TaskID, Repo: cfg.Repo, BaseBranch: cfg.BaseBranch, Prompt: cfg.Prompt,
			TraceParent: cfg.TraceParent, Deadline: cfg.DeadlineTime(), MaxBudgetUSD: cfg.MaxBudgetUSD,
		},
		Reporter: events, Tokens: tokens, Agent: runAgent, Workspace: ws,
		OpenSpecBin: openspecBin, OpenSpecTool: cfg.Agent, Redactor: red, Logger: log,
	})
	log.InfoContext(ctx, "runner finished", "status", out.Status.String(), "reason", out.Reason, "pr_url", out.PRURL)
	span.SetAttributes(attribute.String("taskrunner.outcome", out.Status.String()), attribute.String("taskrunner.pr_url", out.PRURL))
	if out.Status == stages.StatusFailed {
		span.SetStatus(codes.Error, out.Reason)
	}
	if out.Status == stages.StatusFailed {
		return exitFailed
	}
	return exitOK
}

// newAgent builds the adapter TASKRUNNER_AGENT names.
func newAgent(cfg config.Config, bin, repo, home string, env []string, user *proc.User, openAIKey string) agent.Agent {
	if cfg.Agent != config.AgentCodex {
		return claude.New(claude.Config{
			Bin: bin, Dir: repo, Env: env,
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
