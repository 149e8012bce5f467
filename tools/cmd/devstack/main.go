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

func up(ctx context.Context, args []string, logger *slog.Logger) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	dir := fs.String("dev-dir", ".dev", "state directory")
	binDir := fs.String("bin-dir", ".dev/bin", "where make put the binaries")
	if err := fs.Parse(args); err != nil {
		return err
	}
	httpAddr := envOr("TASKRUNNER_HTTP_ADDR", "127.0.0.1:8080")
	grpcAddr := envOr("TASKRUNNER_GRPC_ADDR", "127.0.0.1:7070")
	runnerAddr := envOr("TASKRUNNER_RUNNER_GRPC_ADDR", "127.0.0.1:7443")
	forgeAddr := envOr("DEVSTACK_FORGE_ADDR", "127.0.0.1:3080")
	modelAddr := envOr("DEVSTACK_MODELAPI_ADDR", "127.0.0.1:8089")
	codexAddr := envOr("DEVSTACK_CODEX_MODELAPI_ADDR", "127.0.0.1:8090")
	logDir := filepath.Join(*dir, "logs")
	o := devstack.Options{Dir: *dir, AllowInstall: true, Logger: logger}
	s := &stack{logger: logger}
	defer s.stop()
	for name, addr := range map[string]string{"TASKRUNNER_HTTP_ADDR": httpAddr, "TASKRUNNER_GRPC_ADDR": grpcAddr,
		"TASKRUNNER_RUNNER_GRPC_ADDR": runnerAddr, "DEVSTACK_FORGE_ADDR": forgeAddr, "DEVSTACK_MODELAPI_ADDR": modelAddr, "DEVSTACK_CODEX_MODELAPI_ADDR": codexAddr} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("%s: %s is in use (is another `make run` still running?): %w", name, addr, err)
		}
		l.Close()
	}

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
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	bin := func(n string) string { p, _ := filepath.Abs(filepath.Join(*binDir, n)); return p }
	abs := func(p string) string { a, _ := filepath.Abs(p); return a }

	// Development PKI: the runner CA and the runner port's certificate.
	paths, err := pki.InitDev(filepath.Join(*dir, "pki"), envOr("TASKRUNNER_TRUST_DOMAIN", "taskrunner.local"), nil)
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	secrets, err := loadSecrets(filepath.Join(*dir, "secrets.env"))
	if err != nil {
		return err
	}
	env := []string{
		"TASKRUNNER_DATABASE_URL=" + pg.URL,
		"TASKRUNNER_REDIS_URL=" + rd.URL,
		"TASKRUNNER_GRPC_ADDR=" + grpcAddr,
		"TASKRUNNER_RUNNER_GRPC_ADDR=" + runnerAddr,
		"TASKRUNNER_HTTP_ADDR=" + httpAddr,
		"TASKRUNNER_TASK_ADDR=" + grpcAddr,
		"TASKRUNNER_EVENTS_ADDR=" + grpcAddr,
		"TASKRUNNER_TLS_CERT_FILE=" + abs(paths.ServerCert),
		"TASKRUNNER_TLS_KEY_FILE=" + abs(paths.ServerKey),
		"TASKRUNNER_RUNNER_CA_FILE=" + abs(paths.CACert),
		"TASKRUNNER_RUNNER_CA_KEY_FILE=" + abs(paths.CAKey),
		"TASKRUNNER_RUNNER_EVENTS_ADDR=" + runnerAddr,
		// Every model call of a sandbox goes through the control plane's model proxy.
		"TASKRUNNER_MODEL_PROXY_ADDR=" + envOr("TASKRUNNER_MODEL_PROXY_ADDR", "127.0.0.1:7444"),
		"TASKRUNNER_RUNNER_SERVER_NAME=localhost",
		"TASKRUNNER_PROCESS_RUNNER_BIN=" + bin("runner"),
		"TASKRUNNER_PROCESS_WORK_ROOT=" + abs(filepath.Join(*dir, "sandboxes")),
		"TASKRUNNER_GITHUB_WEBHOOK_SECRET=" + secrets["webhook"],
		// A developer reruns the demo many times a day; production keeps 20.
		"TASKRUNNER_DISPATCH_PER_OWNER_PER_DAY=" + envOr("TASKRUNNER_DISPATCH_PER_OWNER_PER_DAY", "500"),
		// The agent CLIs come from the pinned npm packages.
		"PATH=" + filepath.Join(root, "node_modules", ".bin") + string(os.PathListSeparator) + os.Getenv("PATH"),
	}

	// Jaeger with in-memory storage, unless the caller exports traces
	// elsewhere already (OTEL_EXPORTER_OTLP_ENDPOINT) or it was not built.
	jaegerInfo := "not running (build it with `make jaeger`, or set OTEL_EXPORTER_OTLP_ENDPOINT)"
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" {
		jaegerInfo = "exporting to " + os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	} else if _, err := os.Stat(bin("jaeger")); err == nil {
		uiPort, otlpPort, grpcPort, queryPort := envOr("JAEGER_UI_PORT", "16686"), envOr("JAEGER_OTLP_HTTP_PORT", "4318"),
			envOr("JAEGER_OTLP_GRPC_PORT", "4317"), envOr("JAEGER_QUERY_GRPC_PORT", "16685")
		jg, err := devstack.Start("jaeger", logDir, bin("jaeger"), []string{"--config", filepath.Join(root, "tools", "jaeger", "config.yaml")},
			[]string{"OTEL_TRACES_EXPORTER=none", "OTEL_SDK_DISABLED=true", "JAEGER_UI_PORT=" + uiPort, "JAEGER_OTLP_HTTP_PORT=" + otlpPort, "JAEGER_OTLP_GRPC_PORT=" + grpcPort, "JAEGER_QUERY_GRPC_PORT=" + queryPort})
		if err != nil {
			return err
		}
		s.procs = append(s.procs, jg)
		if err := jg.WaitReady(ctx, 30*time.Second, tcpReady("127.0.0.1:"+otlpPort)); err != nil {
			return err
		}
		jaegerInfo = "http://127.0.0.1:" + uiPort
		env = append(env, "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:"+otlpPort, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
			"TASKRUNNER_CONSOLE_JAEGER_URL=http://127.0.0.1:"+uiPort)
	}

	// The model API: the real one when ANTHROPIC_API_KEY is set, otherwise
	// the scripted stand-in with the demo script.
	modelURL := "the real Anthropic API (ANTHROPIC_API_KEY is set)"
	if os.Getenv("ANTHROPIC_API_KEY") == "" {
		ma, err := devstack.Start("modelapi", logDir, bin("modelapi"), []string{"--addr", modelAddr, "--script", filepath.Join(root, "tools", "demo", "claude-demo.yaml")}, nil)
		if err != nil {
			return err
		}
		s.procs = append(s.procs, ma)
		if err := ma.WaitReady(ctx, 20*time.Second, tcpReady(modelAddr)); err != nil {
			return err
		}
		modelURL = "http://" + modelAddr + " (scripted demo model)"
		// The model proxy forwards to it; sandboxes never see its address or key.
		env = append(env, "TASKRUNNER_ANTHROPIC_UPSTREAM=http://"+modelAddr, "ANTHROPIC_API_KEY=offline-demo-key")
	}
	// Codex speaks the OpenAI Responses API: a second scripted server with
	// the Codex demo script, unless OPENAI_API_KEY selects the real one.
	if os.Getenv("OPENAI_API_KEY") == "" {
		cx, err := devstack.Start("modelapi-codex", logDir, bin("modelapi"), []string{"--addr", codexAddr, "--script", filepath.Join(root, "tools", "demo", "codex-demo.yaml")}, nil)
		if err != nil {
			return err
		}
		s.procs = append(s.procs, cx)
		if err := cx.WaitReady(ctx, 20*time.Second, tcpReady(codexAddr)); err != nil {
			return err
		}
		modelURL += ", http://" + codexAddr + "/v1 (scripted Codex model)"
		env = append(env, "TASKRUNNER_OPENAI_UPSTREAM=http://"+codexAddr, "OPENAI_API_KEY=offline-demo-key")
	}

	// GitHub: the real one when App or token settings are given, otherwise
	// the local forge seeded with the demo repository.
	mergeHint := ""
	forgeInfo := "GitHub (" + envOr("TASKRUNNER_GITHUB_API_URL", "https://api.github.com/") + ")"
	if os.Getenv("TASKRUNNER_GITHUB_APP_ID") == "" && os.Getenv("TASKRUNNER_GITHUB_TOKEN") == "" {
		forgeDir := abs(filepath.Join(*dir, "forge"))
		// The forge keeps pull requests in memory: start every run from the
		// pristine demo repository so the demo works again after a merge.
		if err := os.RemoveAll(filepath.Join(forgeDir, "repos", "demo", "greet.git")); err != nil {
			return err
		}
		fg, err := devstack.Start("forge", logDir, bin("forge"), []string{"--addr", forgeAddr, "--data-dir", forgeDir,
			"--seed", "demo/greet=" + filepath.Join(root, "tools", "demo", "sample-repo"),
			"--webhook-url", "http://" + httpAddr + "/v1/webhooks/github", "--webhook-secret", secrets["webhook"],
			"--app-id", "1", "--app-key-file", filepath.Join(forgeDir, "app-key.pem"),
			"--personal-token", secrets["forge"]}, env) // env carries the OTLP settings
		if err != nil {
			return err
		}
		s.procs = append(s.procs, fg)
		if err := fg.WaitReady(ctx, 20*time.Second, tcpReady(forgeAddr)); err != nil {
			return err
		}
		// The forge forgets its tokens when it restarts: never reuse tokens
		// cached by an earlier run.
		run := make([]byte, 4)
		_, _ = rand.Read(run)
		env = append(env, "TASKRUNNER_GITHUB_CACHE_PREFIX="+os.Getenv("TASKRUNNER_REDIS_PREFIX")+"taskrunner:githubtoken:dev-"+hex.EncodeToString(run)+":")
		forgeInfo = "http://" + forgeAddr + " (local forge; repository demo/greet; admin token in .dev/secrets.env)"
		mergeHint = fmt.Sprintf("\nMerge its pull request on the forge (the webhook moves the task to done):\n\n  curl -s -X PUT http://%s/repos/demo/greet/pulls/<number>/merge -H 'Authorization: token %s'\n", forgeAddr, secrets["forge"])
		env = append(env, "TASKRUNNER_GITHUB_API_URL=http://"+forgeAddr+"/", "TASKRUNNER_GITHUB_GIT_URL=http://"+forgeAddr,
			"TASKRUNNER_GITHUB_APP_ID=1", "TASKRUNNER_GITHUB_APP_KEY_FILE="+filepath.Join(forgeDir, "app-key.pem"))
	}

	migrate := exec.CommandContext(ctx, bin("taskrunnerd"), "migrate")
	migrate.Env = append(os.Environ(), env...)
	if out, err := migrate.CombinedOutput(); err != nil {
		return fmt.Errorf("taskrunnerd migrate: %w\n%s", err, out)
	}
	internal, err := internalToken(ctx, pg.URL, filepath.Join(*dir, "internal-token"))
	if err != nil {
		return err
	}
	env = append(env, "TASKRUNNER_GATEWAY_INTERNAL_TOKEN="+internal)

	daemon, err := devstack.Start("taskrunnerd", logDir, bin("taskrunnerd"), []string{"--services=all"}, env)
	if err != nil {
		return err
	}
	s.procs = append(s.procs, daemon)
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
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

	gw, err := devstack.Start("gateway", logDir, bin("gateway"), nil, env)
	if err != nil {
		return err
	}
	s.procs = append(s.procs, gw)
	if err := gw.WaitReady(ctx, 30*time.Second, func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz: %s", resp.Status)
		}
		return nil
	}); err != nil {
		return err
	}

	token, err := devToken(ctx, pg.URL, filepath.Join(*dir, "token"))
	if err != nil {
		return err
	}
	printBanner(banner{jaeger: jaegerInfo, http: httpAddr, grpc: grpcAddr, token: token, logs: logDir, model: modelURL, forge: forgeInfo, merge: mergeHint})

	exited := make(chan *devstack.Proc, len(s.procs))
	for _, p := range s.procs {
		go func() { <-p.Done(); exited <- p }()
	}
	select {
	case <-ctx.Done():
		logger.Info("stopping the stack")
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
