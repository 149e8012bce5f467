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

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/taskrunner/taskrunner/runner/agent/claude"
	"github.com/taskrunner/taskrunner/runner/config"
	"github.com/taskrunner/taskrunner/runner/eventsclient"
	"github.com/taskrunner/taskrunner/runner/proc"
	"github.com/taskrunner/taskrunner/runner/redact"
	"github.com/taskrunner/taskrunner/runner/repotoken"
	"github.com/taskrunner/taskrunner/runner/stages"
	"github.com/taskrunner/taskrunner/runner/workspace"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
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
	cfg, err := config.Load(os.Environ())
	if err != nil {
		fmt.Fprintln(os.Stderr, "runner: invalid", err)
		return exitConfig
	}
	level, _ := levelOf(cfg.LogLevel)
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("task_id", cfg.TaskID)
	if id := cfg.TraceID(); id != "" {
		log = log.With("trace_id", id)
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

	ctx, cancel := context.WithCancelCause(context.Background())
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

	events, err := eventsclient.New(eventsclient.Config{
		Addr: cfg.EventsAddr, TLS: tlsCfg.Clone(), TaskID: cfg.TaskID, RunnerVersion: version, Logger: log,
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
	claudeBin, err := exec.LookPath(cfg.ClaudeBin)
	if err != nil {
		return failEarly("TASKRUNNER_CLAUDE_BIN: " + err.Error())
	}
	openspecBin, err := exec.LookPath(cfg.OpenSpecBin)
	if err != nil {
		return failEarly("TASKRUNNER_OPENSPEC_BIN: " + err.Error())
	}
	claudeBin, _ = filepath.Abs(claudeBin)
	openspecBin, _ = filepath.Abs(openspecBin)
	extraPath := []string{filepath.Dir(openspecBin), filepath.Dir(claudeBin)}

	conn, err := grpc.NewClient(cfg.TokenAddr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg.Clone())))
	if err != nil {
		return failEarly("GitHubTokenService: " + err.Error())
	}
	defer conn.Close()
	tokens := repotoken.NewCached(repotoken.NewGRPC(conn, cfg.TaskID, cfg.TraceParent), nil,
		func(t repotoken.Token) { red.AddLiteral(t.Value) })

	environ := os.Environ()
	ws := workspace.New(workspace.Config{
		Dir: repo, Git: cfg.GitBin, Env: stages.BaseEnv(environ, home, extraPath), User: user,
		TaskID: cfg.TaskID, BaseBranch: cfg.BaseBranch,
	})
	agent := claude.New(claude.Config{
		Bin: claudeBin, Dir: repo, Env: stages.AgentEnv(environ, home, extraPath, asRoot && user == nil),
		User: user, MaxTurns: cfg.MaxTurns, MaxBudgetUSD: cfg.MaxBudgetUSD,
	})
	out := stages.Run(ctx, stages.Options{
		Task: stages.Task{
			ID: cfg.TaskID, Repo: cfg.Repo, BaseBranch: cfg.BaseBranch, Prompt: cfg.Prompt,
			TraceParent: cfg.TraceParent, Deadline: cfg.DeadlineTime(), MaxBudgetUSD: cfg.MaxBudgetUSD,
		},
		Reporter: events, Tokens: tokens, Agent: agent, Workspace: ws,
		OpenSpecBin: openspecBin, OpenSpecTool: "claude", Redactor: red, Logger: log,
	})
	log.Info("runner finished", "status", out.Status.String(), "reason", out.Reason, "pr_url", out.PRURL)
	if out.Status == stages.StatusFailed {
		return exitFailed
	}
	return exitOK
}

func levelOf(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}
