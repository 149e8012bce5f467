package main

import (
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/taskrunner/taskrunner/platform/rpcauth"
	"github.com/taskrunner/taskrunner/platform/telemetry"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/config"
	"github.com/taskrunner/taskrunner/services/dispatch"
	"github.com/taskrunner/taskrunner/services/events"
	"github.com/taskrunner/taskrunner/services/githubtoken"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/rpcserver"
	"github.com/taskrunner/taskrunner/services/sandbox"
	"github.com/taskrunner/taskrunner/services/sandbox/process"
	"github.com/taskrunner/taskrunner/services/task"
)

// app is everything serve runs.
type app struct {
	names        []string
	public       *grpc.Server
	runner       *grpc.Server // nil without TLS material
	health       *rpcserver.Health
	runnerHealth *rpcserver.Health
	events       *events.Server
	background   []func(context.Context)
	closers      []func()
}

func (a *app) close() {
	for i := len(a.closers) - 1; i >= 0; i-- {
		a.closers[i]()
	}
}

// assemble builds the configured services and the two ports that serve
// them (ports.go): the public port (bearer tokens) serves everything but
// the runner RPCs, the runner port (mTLS) serves only those.
func assemble(ctx context.Context, cfg config.Daemon, pool *pgxpool.Pool, rdb *redis.Client, logger *slog.Logger) (*app, error) {
	names, _ := cfg.ServiceList()
	has := func(n string) bool { return slices.Contains(names, n) }
	a := &app{names: names}
	publisher := task.NewRedisPublisher(rdb, cfg.RedisPrefix, logger)
	tasks := task.NewStore(pool).WithPublisher(publisher)
	tokens := auth.NewStore(pool)
	var services []service
	register := func(desc *grpc.ServiceDesc, impl any) { services = append(services, service{desc, impl}) }

	var reloader *pki.Reloader
	if cfg.TLSConfigured() {
		r, err := pki.NewReloader(cfg.TLSCertFile, cfg.TLSKeyFile, cfg.RunnerCAFile, logger)
		if err != nil {
			return nil, fmt.Errorf("TASKRUNNER_TLS_CERT_FILE / TASKRUNNER_TLS_KEY_FILE / TASKRUNNER_RUNNER_CA_FILE: %w", err)
		}
		reloader = r
	} else if has(config.ServiceEvents) || has(config.ServiceGitHubToken) {
		logger.Warn("no TLS material (TASKRUNNER_TLS_CERT_FILE, TASKRUNNER_TLS_KEY_FILE, TASKRUNNER_RUNNER_CA_FILE): runners cannot connect; run `taskctl pki init`")
	}

	var taskSrv *task.Server
	var pullRequests dispatch.PullRequests
	if has(config.ServiceTask) {
		taskSrv = task.New(tasks, nil, logger)
		taskSrv.SetMaxRuns(cfg.MaxRuns)
		var budgets task.Budgets
		if err := env.Parse(&budgets); err != nil {
			return nil, fmt.Errorf("configuration: %w", err)
		}
		if err := budgets.Validate(); err != nil {
			return nil, err
		}
		taskSrv.SetBudgets(budgets)
		register(&taskrunnerv1.TaskService_ServiceDesc, taskSrv)
		// Tokens are managed where the public API is served.
		register(&taskrunnerv1.TokenService_ServiceDesc, auth.NewTokenServer(tokens))
	}
	if has(config.ServiceEvents) {
		ev, err := events.New(events.Config{TrustDomain: cfg.TrustDomain, RedisPrefix: cfg.RedisPrefix, Committers: cfg.EventsCommitters,
			HeartbeatInterval: cfg.HeartbeatInterval}, pool, rdb, logger)
		if err != nil {
			return nil, err
		}
		a.events = ev
		register(&taskrunnerv1.EventsService_ServiceDesc, ev)
	}
	if has(config.ServiceGitHubToken) {
		var gh githubtoken.Config
		if err := env.Parse(&gh); err != nil {
			return nil, fmt.Errorf("configuration: %w", err)
		}
		gh.TrustDomain = cfg.TrustDomain
		if err := gh.Validate(); err != nil {
			return nil, err
		}
		srv, err := githubtoken.New(gh, githubtoken.Deps{Tasks: tasks, Redis: rdb, Logger: logger})
		if err != nil {
			return nil, err
		}
		pullRequests = srv
		a.closers = append(a.closers, srv.Close)
		if taskSrv != nil {
			// Creates and dispatches are refused before spending when the
			// repository or base branch is out of the App's reach.
			taskSrv.SetRepoChecker(srv)
		}
		register(&taskrunnerv1.GitHubTokenService_ServiceDesc, srv)
	}
	if has(config.ServiceDispatch) {
		d, err := newDispatch(cfg, pool, rdb, logger, publisher, pullRequests)
		if err != nil {
			return nil, err
		}
		register(&taskrunnerv1.DispatchService_ServiceDesc, d)
		a.background = append(a.background, func(ctx context.Context) { d.Listen(ctx, d.ReaperInterval()) }, d.RunReaper)
		if taskSrv != nil {
			taskSrv.SetDispatcher(d)
		}
	} else if taskSrv != nil && cfg.DispatchAddr != "" {
		conn, err := grpc.NewClient(cfg.DispatchAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithStatsHandler(otelgrpc.NewClientHandler()),
			grpc.WithPerRPCCredentials(rpcauth.BearerToken(cfg.InternalToken)))
		if err != nil {
			return nil, fmt.Errorf("TASKRUNNER_DISPATCH_ADDR: %w", err)
		}
		a.closers = append(a.closers, func() { _ = conn.Close() })
		taskSrv.SetDispatcher(&remoteDispatcher{c: taskrunnerv1.NewDispatchServiceClient(conn)})
	}

	if err := a.publicPort(cfg, logger, tokens, services); err != nil {
		return nil, err
	}
	if err := a.modelProxy(cfg, reloader, tasks, logger); err != nil {
		return nil, err
	}
	if reloader != nil && cfg.RunnerGRPCAddr != "" {
		a.runnerPort(logger, reloader, services)
		a.background = append(a.background, func(ctx context.Context) {
			a.runnerHealth.Watch(ctx, logger, 2*time.Second, func(ctx context.Context) error { return ping(ctx, pool, rdb) })
		})
	}
	return a, nil
}

func newDispatch(cfg config.Daemon, pool *pgxpool.Pool, rdb *redis.Client, logger *slog.Logger, pub task.Publisher, prs dispatch.PullRequests) (*dispatch.Server, error) {
	var dc dispatch.Config
	if err := env.Parse(&dc); err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	dc.HeartbeatInterval = cfg.HeartbeatInterval
	if cfg.RunnerCAFile == "" || cfg.RunnerCAKeyFile == "" {
		return nil, fmt.Errorf("TASKRUNNER_RUNNER_CA_FILE and TASKRUNNER_RUNNER_CA_KEY_FILE: the dispatch service mints task certificates and needs the runner CA (create one with `taskctl pki init`)")
	}
	ca, err := pki.LoadCAFiles(cfg.RunnerCAFile, cfg.RunnerCAKeyFile)
	if err != nil {
		return nil, fmt.Errorf("TASKRUNNER_RUNNER_CA_FILE / TASKRUNNER_RUNNER_CA_KEY_FILE: %w", err)
	}
	if ca.TrustDomain() != cfg.TrustDomain {
		return nil, fmt.Errorf("TASKRUNNER_TRUST_DOMAIN: %q, but the runner CA is for %q", cfg.TrustDomain, ca.TrustDomain())
	}
	prov, err := newProvider(cfg, logger)
	if err != nil {
		return nil, err
	}
	return dispatch.New(dc, dispatch.Deps{Pool: pool, Publisher: pub, PullRequests: prs, Provider: prov, CA: ca, Logger: logger,
		Canceller: cancelPublisher{rdb: rdb, prefix: cfg.RedisPrefix}, Traceparent: telemetry.Traceparent})
}

func newProvider(cfg config.Daemon, logger *slog.Logger) (sandbox.Provider, error) {
	switch cfg.SandboxProvider {
	case "process":
		bin := cfg.ProcessRunnerBin
		if filepath.Base(bin) == bin {
			if p, err := exec.LookPath(bin); err == nil {
				bin = p
			}
		}
		return process.New(process.Config{RunnerBin: bin, WorkRoot: cfg.ProcessWorkRoot, Bwrap: cfg.ProcessBwrap}, logger)
	}
	return newRemoteProvider(cfg, logger)
}

// cancelPublisher pushes Cancel through Redis to whichever Events replica
// holds the runner's stream (this process or another).
type cancelPublisher struct {
	rdb    *redis.Client
	prefix string
}

func (c cancelPublisher) Cancel(ctx context.Context, taskID, reason string) error {
	return c.rdb.Publish(ctx, events.CancelChannel(c.prefix, taskID), reason).Err()
}

// remoteDispatcher reaches DispatchService in another process.
type remoteDispatcher struct {
	c taskrunnerv1.DispatchServiceClient
}

func (r *remoteDispatcher) DispatchTask(ctx context.Context, id string) (task.Task, error) {
	resp, err := r.c.Dispatch(ctx, &taskrunnerv1.DispatchRequest{TaskId: id})
	if err != nil {
		return task.Task{}, err
	}
	return task.FromProto(resp.GetTask()), nil
}

func (r *remoteDispatcher) StartFollowUp(ctx context.Context, id string) (task.Task, error) {
	resp, err := r.c.StartNextRun(ctx, &taskrunnerv1.StartNextRunRequest{TaskId: id})
	if err != nil {
		return task.Task{}, err
	}
	return task.FromProto(resp.GetTask()), nil
}

func (r *remoteDispatcher) CancelTask(ctx context.Context, id, reason string, actor task.Actor) (task.Task, error) {
	resp, err := r.c.Cancel(ctx, &taskrunnerv1.CancelRequest{TaskId: id, Reason: reason, Actor: string(actor)})
	if err != nil {
		return task.Task{}, err
	}
	return task.FromProto(resp.GetTask()), nil
}
