package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/store"
	"github.com/taskrunner/taskrunner/tools/devstack"
)

func main() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	switch os.Args[1] {
	case "-h", "-help", "--help", "help":
		fmt.Print(usage)
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "deps":
		err = deps(ctx, os.Args[2:], logger)
	case "up":
		err = up(ctx, os.Args[2:], logger)
	default:
		err = fmt.Errorf("unknown command %q (want deps or up)", os.Args[1])
	}
	if errors.Is(err, flag.ErrHelp) {
		return // the flags were printed
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "devstack:", err)
		os.Exit(1)
	}
}

// usage names the environment variables devstack reads, never their values.
const usage = `usage: devstack deps [--dev-dir DIR]
       devstack up [--dev-dir DIR] [--bin-dir DIR]

deps  finds or starts PostgreSQL and Redis for the tests and prints export
      lines (TEST_DATABASE_URL, TEST_REDIS_URL).
up    runs the whole stack locally (make run): PostgreSQL, Redis, taskrunnerd,
      the gateway, the forge and the scripted model APIs. Addresses come from
      TASKRUNNER_HTTP_ADDR, TASKRUNNER_GRPC_ADDR, TASKRUNNER_RUNNER_GRPC_ADDR,
      DEVSTACK_FORGE_ADDR, DEVSTACK_MODELAPI_ADDR, DEVSTACK_CODEX_MODELAPI_ADDR;
      ANTHROPIC_API_KEY / OPENAI_API_KEY, when set, use the real model APIs.

Run "devstack deps --help" or "devstack up --help" for the flags.
`

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// deps prints `export` lines for the test suite; servers it starts keep
// running (they live in .dev/ and on non-standard ports).
func deps(ctx context.Context, args []string, logger *slog.Logger) error {
	fs := flag.NewFlagSet("deps", flag.ContinueOnError)
	dir := fs.String("dev-dir", ".dev", "state directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o := devstack.Options{Dir: *dir, AllowInstall: true, Logger: logger}
	pg, err := devstack.EnsurePostgres(ctx, envOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"), o)
	if err != nil {
		return err
	}
	rd, err := devstack.EnsureRedis(ctx, envOr("TEST_REDIS_URL", "redis://127.0.0.1:6379/0"), o)
	if err != nil {
		return err
	}
	fmt.Printf("export TEST_DATABASE_URL=%q\nexport TEST_REDIS_URL=%q\n", pg.URL, rd.URL)
	return nil
}

type stack struct {
	procs  []*devstack.Proc
	deps   []*devstack.Dep
	logger *slog.Logger
}

func (s *stack) stop() {
	for i := len(s.procs) - 1; i >= 0; i-- {
		p := s.procs[i]
		if err := p.Stop(15 * time.Second); err != nil && !strings.Contains(err.Error(), "signal: terminated") {
			s.logger.Warn("stopped with error", "process", p.Name, "error", err)
		}
	}
	for i := len(s.deps) - 1; i >= 0; i-- {
		s.deps[i].Stop()
	}
}

// upConfig is where `up` puts things: its flags and the stack's addresses.
type upConfig struct {
	dir, binDir, root, logDir                                       string
	httpAddr, grpcAddr, runnerAddr, forgeAddr, modelAddr, codexAddr string
}

func (c upConfig) bin(n string) string { p, _ := filepath.Abs(filepath.Join(c.binDir, n)); return p }

func abs(p string) string { a, _ := filepath.Abs(p); return a }

// up starts the whole stack in dependency order — PostgreSQL and Redis,
// Jaeger, the model API stand-ins, the forge, taskrunnerd, the gateway —
// prints the banner and waits for a signal or for a process to exit.
func up(ctx context.Context, args []string, logger *slog.Logger) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	dir := fs.String("dev-dir", ".dev", "state directory")
	binDir := fs.String("bin-dir", ".dev/bin", "where make put the binaries")
	if err := fs.Parse(args); err != nil {
		return err
	}
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	c := upConfig{
		dir: *dir, binDir: *binDir, root: root, logDir: filepath.Join(*dir, "logs"),
		httpAddr:   envOr("TASKRUNNER_HTTP_ADDR", "127.0.0.1:8080"),
		grpcAddr:   envOr("TASKRUNNER_GRPC_ADDR", "127.0.0.1:7070"),
		runnerAddr: envOr("TASKRUNNER_RUNNER_GRPC_ADDR", "127.0.0.1:7443"),
		forgeAddr:  envOr("DEVSTACK_FORGE_ADDR", "127.0.0.1:3080"),
		modelAddr:  envOr("DEVSTACK_MODELAPI_ADDR", "127.0.0.1:8089"),
		codexAddr:  envOr("DEVSTACK_CODEX_MODELAPI_ADDR", "127.0.0.1:8090"),
	}
	s := &stack{logger: logger}
	defer s.stop()
	if err := c.checkPortsFree(); err != nil {
		return err
	}
	o := devstack.Options{Dir: c.dir, AllowInstall: true, Logger: logger}
	pg, err := devstack.EnsurePostgres(ctx, envOr("TASKRUNNER_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/taskrunner?sslmode=disable"), o)
	if err != nil {
		return err
	}
	s.deps = append(s.deps, pg)
	rd, err := devstack.EnsureRedis(ctx, envOr("TASKRUNNER_REDIS_URL", "redis://127.0.0.1:6379/0"), o)
	if err != nil {
		return err
	}
	s.deps = append(s.deps, rd)
	secrets, err := loadSecrets(filepath.Join(c.dir, "secrets.env"))
	if err != nil {
		return err
	}
	env, err := c.baseEnv(pg.URL, rd.URL, secrets)
	if err != nil {
		return err
	}
	b := banner{http: c.httpAddr, grpc: c.grpcAddr, logs: c.logDir}
	if b.jaeger, env, err = s.startJaeger(ctx, c, env); err != nil {
		return err
	}
	if b.model, env, err = s.startModelAPIs(ctx, c, env); err != nil {
		return err
	}
	if b.forge, b.merge, env, err = s.startForge(ctx, c, env, secrets); err != nil {
		return err
	}
	if err := s.startDaemon(ctx, c, env, pg.URL); err != nil {
		return err
	}
	if b.token, err = devToken(ctx, pg.URL, filepath.Join(c.dir, "token")); err != nil {
		return err
	}
	printBanner(b)
	return s.wait(ctx)
}

// checkPortsFree fails early, naming the setting, when an address of the
// stack is taken.
func (c upConfig) checkPortsFree() error {
	for name, addr := range map[string]string{"TASKRUNNER_HTTP_ADDR": c.httpAddr, "TASKRUNNER_GRPC_ADDR": c.grpcAddr,
		"TASKRUNNER_RUNNER_GRPC_ADDR": c.runnerAddr, "DEVSTACK_FORGE_ADDR": c.forgeAddr, "DEVSTACK_MODELAPI_ADDR": c.modelAddr, "DEVSTACK_CODEX_MODELAPI_ADDR": c.codexAddr} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("%s: %s is in use (is another `make run` still running?): %w", name, addr, err)
		}
		l.Close()
	}
	return nil
}

// baseEnv creates the development PKI (the runner CA and the runner port's
// certificate) and answers the environment every process of the stack gets.
func (c upConfig) baseEnv(dbURL, redisURL string, secrets map[string]string) ([]string, error) {
	paths, err := pki.InitDev(filepath.Join(c.dir, "pki"), envOr("TASKRUNNER_TRUST_DOMAIN", "taskrunner.local"), nil)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	return []string{
		"TASKRUNNER_DATABASE_URL=" + dbURL,
		"TASKRUNNER_REDIS_URL=" + redisURL,
		"TASKRUNNER_GRPC_ADDR=" + c.grpcAddr,
		"TASKRUNNER_RUNNER_GRPC_ADDR=" + c.runnerAddr,
		"TASKRUNNER_HTTP_ADDR=" + c.httpAddr,
		"TASKRUNNER_TASK_ADDR=" + c.grpcAddr,
		"TASKRUNNER_EVENTS_ADDR=" + c.grpcAddr,
		"TASKRUNNER_TLS_CERT_FILE=" + abs(paths.ServerCert),
		"TASKRUNNER_TLS_KEY_FILE=" + abs(paths.ServerKey),
		"TASKRUNNER_RUNNER_CA_FILE=" + abs(paths.CACert),
		"TASKRUNNER_RUNNER_CA_KEY_FILE=" + abs(paths.CAKey),
		"TASKRUNNER_RUNNER_EVENTS_ADDR=" + c.runnerAddr,
		// Every model call of a sandbox goes through the control plane's model proxy.
		"TASKRUNNER_MODEL_PROXY_ADDR=" + envOr("TASKRUNNER_MODEL_PROXY_ADDR", "127.0.0.1:7444"),
		"TASKRUNNER_RUNNER_SERVER_NAME=localhost",
		"TASKRUNNER_PROCESS_RUNNER_BIN=" + c.bin("runner"),
		"TASKRUNNER_PROCESS_WORK_ROOT=" + abs(filepath.Join(c.dir, "sandboxes")),
		"TASKRUNNER_GITHUB_WEBHOOK_SECRET=" + secrets["webhook"],
		// A developer reruns the demo many times a day; production keeps 20.
		"TASKRUNNER_DISPATCH_PER_OWNER_PER_DAY=" + envOr("TASKRUNNER_DISPATCH_PER_OWNER_PER_DAY", "500"),
		// The agent CLIs come from the pinned npm packages.
		"PATH=" + filepath.Join(c.root, "node_modules", ".bin") + string(os.PathListSeparator) + os.Getenv("PATH"),
	}, nil
}

// startJaeger starts Jaeger with in-memory storage, unless the caller
// exports traces elsewhere already (OTEL_EXPORTER_OTLP_ENDPOINT) or it was
// not built. It answers the banner's line and env with the OTLP settings.
func (s *stack) startJaeger(ctx context.Context, c upConfig, env []string) (string, []string, error) {
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" {
		return "exporting to " + os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT"), env, nil
	}
	if _, err := os.Stat(c.bin("jaeger")); err != nil {
		return "not running (build it with `make jaeger`, or set OTEL_EXPORTER_OTLP_ENDPOINT)", env, nil
	}
	uiPort, otlpPort, grpcPort, queryPort := envOr("JAEGER_UI_PORT", "16686"), envOr("JAEGER_OTLP_HTTP_PORT", "4318"),
		envOr("JAEGER_OTLP_GRPC_PORT", "4317"), envOr("JAEGER_QUERY_GRPC_PORT", "16685")
	jg, err := devstack.Start("jaeger", c.logDir, c.bin("jaeger"), []string{"--config", filepath.Join(c.root, "tools", "jaeger", "config.yaml")},
		[]string{"OTEL_TRACES_EXPORTER=none", "OTEL_SDK_DISABLED=true", "JAEGER_UI_PORT=" + uiPort, "JAEGER_OTLP_HTTP_PORT=" + otlpPort, "JAEGER_OTLP_GRPC_PORT=" + grpcPort, "JAEGER_QUERY_GRPC_PORT=" + queryPort})
	if err != nil {
		return "", nil, err
	}
	s.procs = append(s.procs, jg)
	if err := jg.WaitReady(ctx, 30*time.Second, tcpReady("127.0.0.1:"+otlpPort)); err != nil {
		return "", nil, err
	}
	env = append(env, "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:"+otlpPort, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"TASKRUNNER_CONSOLE_JAEGER_URL=http://127.0.0.1:"+uiPort)
	return "http://127.0.0.1:" + uiPort, env, nil
}

// startModelAPIs starts the scripted model API stand-ins (Anthropic
// Messages with the Claude demo script, OpenAI Responses with the Codex
// one) unless ANTHROPIC_API_KEY / OPENAI_API_KEY select the real ones. The
// model proxy forwards to them; sandboxes never see their address or key.
func (s *stack) startModelAPIs(ctx context.Context, c upConfig, env []string) (string, []string, error) {
	modelURL := "the real Anthropic API (ANTHROPIC_API_KEY is set)"
	if os.Getenv("ANTHROPIC_API_KEY") == "" {
		if err := s.startModelAPI(ctx, c, "modelapi", c.modelAddr, "claude-demo.yaml"); err != nil {
			return "", nil, err
		}
		modelURL = "http://" + c.modelAddr + " (scripted demo model)"
		env = append(env, "TASKRUNNER_ANTHROPIC_UPSTREAM=http://"+c.modelAddr, "ANTHROPIC_API_KEY=offline-demo-key")
	}
	if os.Getenv("OPENAI_API_KEY") == "" {
		if err := s.startModelAPI(ctx, c, "modelapi-codex", c.codexAddr, "codex-demo.yaml"); err != nil {
			return "", nil, err
		}
		modelURL += ", http://" + c.codexAddr + "/v1 (scripted Codex model)"
		env = append(env, "TASKRUNNER_OPENAI_UPSTREAM=http://"+c.codexAddr, "OPENAI_API_KEY=offline-demo-key")
	}
	return modelURL, env, nil
}

// startModelAPI starts one scripted model API with a demo script.
func (s *stack) startModelAPI(ctx context.Context, c upConfig, name, addr, script string) error {
	p, err := devstack.Start(name, c.logDir, c.bin("modelapi"), []string{"--addr", addr, "--script", filepath.Join(c.root, "tools", "demo", script)}, nil)
	if err != nil {
		return err
	}
	s.procs = append(s.procs, p)
	return p.WaitReady(ctx, 20*time.Second, tcpReady(addr))
}

// startForge starts the local forge seeded with the demo repository, unless
// GitHub App or token settings select the real GitHub. It answers the
// banner's forge line and merge hint and env with the GitHub settings.
func (s *stack) startForge(ctx context.Context, c upConfig, env []string, secrets map[string]string) (info, mergeHint string, _ []string, _ error) {
	if os.Getenv("TASKRUNNER_GITHUB_APP_ID") != "" || os.Getenv("TASKRUNNER_GITHUB_TOKEN") != "" {
		return "GitHub (" + envOr("TASKRUNNER_GITHUB_API_URL", "https://api.github.com/") + ")", "", env, nil
	}
	forgeDir := abs(filepath.Join(c.dir, "forge"))
	// The forge keeps pull requests in memory: start every run from the
	// pristine demo repository so the demo works again after a merge.
	if err := os.RemoveAll(filepath.Join(forgeDir, "repos", "demo", "greet.git")); err != nil {
		return "", "", nil, err
	}
	fg, err := devstack.Start("forge", c.logDir, c.bin("forge"), []string{"--addr", c.forgeAddr, "--data-dir", forgeDir,
		"--seed", "demo/greet=" + filepath.Join(c.root, "tools", "demo", "sample-repo"),
		"--webhook-url", "http://" + c.httpAddr + "/v1/webhooks/github", "--webhook-secret", secrets["webhook"],
		"--app-id", "1", "--app-key-file", filepath.Join(forgeDir, "app-key.pem"),
		"--personal-token", secrets["forge"]}, env) // env carries the OTLP settings
	if err != nil {
		return "", "", nil, err
	}
	s.procs = append(s.procs, fg)
	if err := fg.WaitReady(ctx, 20*time.Second, tcpReady(c.forgeAddr)); err != nil {
		return "", "", nil, err
	}
	// The forge forgets its tokens when it restarts: never reuse tokens
	// cached by an earlier run.
	run := make([]byte, 4)
	_, _ = rand.Read(run)
	env = append(env, "TASKRUNNER_GITHUB_CACHE_PREFIX="+os.Getenv("TASKRUNNER_REDIS_PREFIX")+"taskrunner:githubtoken:dev-"+hex.EncodeToString(run)+":")
	info = "http://" + c.forgeAddr + " (local forge; repository demo/greet; admin token in .dev/secrets.env)"
	mergeHint = fmt.Sprintf("\nMerge its pull request on the forge (the webhook moves the task to done):\n\n  curl -s -X PUT http://%s/repos/demo/greet/pulls/<number>/merge -H 'Authorization: token %s'\n", c.forgeAddr, secrets["forge"])
	env = append(env, "TASKRUNNER_GITHUB_API_URL=http://"+c.forgeAddr+"/", "TASKRUNNER_GITHUB_GIT_URL=http://"+c.forgeAddr,
		"TASKRUNNER_GITHUB_APP_ID=1", "TASKRUNNER_GITHUB_APP_KEY_FILE="+filepath.Join(forgeDir, "app-key.pem"))
	return info, mergeHint, env, nil
}

// startDaemon migrates the database, starts taskrunnerd and, once its health
// check serves, the gateway with the gateway's internal token.
func (s *stack) startDaemon(ctx context.Context, c upConfig, env []string, dbURL string) error {
	migrate := exec.CommandContext(ctx, c.bin("taskrunnerd"), "migrate")
	migrate.Env = append(os.Environ(), env...)
	if out, err := migrate.CombinedOutput(); err != nil {
		return fmt.Errorf("taskrunnerd migrate: %w\n%s", err, out)
	}
	internal, err := internalToken(ctx, dbURL, filepath.Join(c.dir, "internal-token"))
	if err != nil {
		return err
	}
	env = append(env, "TASKRUNNER_GATEWAY_INTERNAL_TOKEN="+internal)

	daemon, err := devstack.Start("taskrunnerd", c.logDir, c.bin("taskrunnerd"), []string{"--services=all"}, env)
	if err != nil {
		return err
	}
	s.procs = append(s.procs, daemon)
	conn, err := grpc.NewClient(c.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	if err := daemon.WaitReady(ctx, 60*time.Second, func(ctx context.Context) error {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			err = errors.New(r.GetStatus().String())
		}
		return err
	}); err != nil {
		return err
	}

	gw, err := devstack.Start("gateway", c.logDir, c.bin("gateway"), nil, env)
	if err != nil {
		return err
	}
	s.procs = append(s.procs, gw)
	return gw.WaitReady(ctx, 30*time.Second, func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.httpAddr+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz: %s", resp.Status)
		}
		return nil
	})
}

// wait returns nil on a signal, or the error of the first process to exit.
func (s *stack) wait(ctx context.Context) error {
	exited := make(chan *devstack.Proc, len(s.procs))
	for _, p := range s.procs {
		go func() { <-p.Done(); exited <- p }()
	}
	select {
	case <-ctx.Done():
		s.logger.Info("stopping the stack")
		return nil
	case p := <-exited:
		return fmt.Errorf("%s exited: %v (log: %s)", p.Name, p.Err(), p.LogPath)
	}
}

// devToken reuses the token saved by an earlier run when it still works,
// and otherwise creates one for owner "dev".
func devToken(ctx context.Context, dbURL, path string) (string, error) {
	pool, err := store.Open(ctx, dbURL)
	if err != nil {
		return "", err
	}
	defer pool.Close()
	tokens := auth.NewStore(pool)
	if b, err := os.ReadFile(path); err == nil {
		tok := strings.TrimSpace(string(b))
		if _, err := tokens.Authenticate(ctx, tok); err == nil {
			return tok, nil
		}
	}
	tok, _, err := tokens.Create(ctx, "dev", nil, "make run")
	if err != nil {
		return "", err
	}
	return tok, os.WriteFile(path, []byte(tok+"\n"), 0o600)
}

type banner struct{ http, grpc, token, logs, model, forge, merge, jaeger string }

func printBanner(b banner) {
	fmt.Printf(`
taskrunner is up.

  REST API     http://%[1]s/v1/tasks        (OpenAPI: http://%[1]s/openapi.json)
  gRPC         %[2]s                   (taskctl --addr %[2]s)
  console      http://%[1]s/
  Jaeger       %[8]s
  model API    %[5]s
  forge        %[6]s
  logs         %[4]s/   (sandboxes: .dev/sandboxes/)
  token        %[3]s     (owner "dev"; also in .dev/token)

Create a task (it comes back with status proposing; dispatch it with POST /v1/tasks/<id>:dispatch):

  curl -s -X POST http://%[1]s/v1/tasks -H 'Authorization: Bearer %[3]s' -d '{"repo":"demo/greet","prompt":"Add a --farewell flag to greet"}'

Or start the demo task in one go (creates and dispatches it; the agent adds --farewell to demo/greet):

  curl -s -X POST http://%[1]s/v1/tasks -H 'Authorization: Bearer %[3]s' -d '{"repo":"demo/greet","prompt":"Add a --farewell flag to greet","dispatch":true}'

The same with Codex: add "agent":"AGENT_CODEX" to the JSON body.

Follow it live:

  curl -N http://%[1]s/v1/tasks/<id>/events -H 'Authorization: Bearer %[3]s'
  TASKRUNNER_TOKEN=%[3]s .dev/bin/taskctl task watch <id>

Once it awaits review, ask for a follow-up (run 2 revises the same pull request, resuming the agent's session):

  curl -s -X POST http://%[1]s/v1/tasks/<id>:followup -H 'Authorization: Bearer %[3]s' -d '{"prompt":"Please also accept -f as a short form of --farewell."}'

or review it on the forge as a collaborator (the signed webhook starts the follow-up):

  curl -s -X PUT %[6]s/_forge/repos/demo/greet/collaborators/rita -d '{"permission":"write"}'
  curl -s -X POST %[6]s/_forge/as/rita/repos/demo/greet/pulls/<number>/reviews -d '{"event":"REQUEST_CHANGES","body":"Please also accept -f as a short form of --farewell."}'
%[7]s
Press Ctrl-C to stop everything this command started.
`, b.http, b.grpc, b.token, b.logs, b.model, b.forge, b.merge, b.jaeger)
}

// loadSecrets keeps development secrets stable across runs.
func loadSecrets(path string) (map[string]string, error) {
	out := map[string]string{}
	if b, err := os.ReadFile(path); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, "="); ok {
				out[k] = v
			}
		}
	}
	changed := false
	for _, k := range []string{"webhook", "forge"} {
		if out[k] == "" {
			buf := make([]byte, 24)
			_, _ = rand.Read(buf)
			out[k] = hex.EncodeToString(buf)
			if k == "forge" {
				out[k] = "forge_" + out[k]
			}
			changed = true
		}
	}
	if changed {
		if err := os.WriteFile(path, []byte("webhook="+out["webhook"]+"\nforge="+out["forge"]+"\n"), 0o600); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func tcpReady(addr string) func(context.Context) error {
	return func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
		}
		return err
	}
}

// internalToken is the gateway's internal-scope token (for the webhook).
func internalToken(ctx context.Context, dbURL, path string) (string, error) {
	pool, err := store.Open(ctx, dbURL)
	if err != nil {
		return "", err
	}
	defer pool.Close()
	tokens := auth.NewStore(pool)
	if b, err := os.ReadFile(path); err == nil {
		tok := strings.TrimSpace(string(b))
		if _, err := tokens.Authenticate(ctx, tok); err == nil {
			return tok, nil
		}
	}
	tok, _, err := tokens.Create(ctx, "gateway", []string{auth.ScopeInternal}, "make run: gateway webhook")
	if err != nil {
		return "", err
	}
	return tok, os.WriteFile(path, []byte(tok+"\n"), 0o600)
}
