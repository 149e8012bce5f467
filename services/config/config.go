package config

import (
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
)

// Service names accepted by TASKRUNNER_SERVICES / --services.
const (
	ServiceTask        = "task"
	ServiceDispatch    = "dispatch"
	ServiceGitHubToken = "githubtoken"
	ServiceEvents      = "events"
)

// AllServices lists every service in start order.
var AllServices = []string{ServiceTask, ServiceDispatch, ServiceGitHubToken, ServiceEvents}

// Daemon is taskrunnerd's configuration.
type Daemon struct {
	DatabaseURL     string        `env:"TASKRUNNER_DATABASE_URL" envDefault:"postgres://postgres@127.0.0.1:5432/taskrunner?sslmode=disable"`
	RedisURL        string        `env:"TASKRUNNER_REDIS_URL" envDefault:"redis://127.0.0.1:6379/0"`
	GRPCAddr        string        `env:"TASKRUNNER_GRPC_ADDR" envDefault:"127.0.0.1:7070"`
	Services        string        `env:"TASKRUNNER_SERVICES" envDefault:"all"`
	LogLevel        string        `env:"TASKRUNNER_LOG_LEVEL" envDefault:"info"`
	LogFormat       string        `env:"TASKRUNNER_LOG_FORMAT" envDefault:"json"`
	ShutdownTimeout time.Duration `env:"TASKRUNNER_SHUTDOWN_TIMEOUT" envDefault:"20s"`
	// MetricsAddr serves Prometheus metrics at /metrics; empty disables it.
	MetricsAddr string `env:"TASKRUNNER_METRICS_ADDR" envDefault:"127.0.0.1:9464"`
	// GRPCTLSCertFile and GRPCTLSKeyFile make the public port (GRPCAddr)
	// serve TLS; without them it is plaintext, for local development and
	// private networks. Clients verify it with TASKRUNNER_GRPC_CA_FILE.
	GRPCTLSCertFile string `env:"TASKRUNNER_GRPC_TLS_CERT_FILE"`
	GRPCTLSKeyFile  string `env:"TASKRUNNER_GRPC_TLS_KEY_FILE"`
	// GRPCReflection registers gRPC reflection on the public port (never on
	// the runner port).
	GRPCReflection bool `env:"TASKRUNNER_GRPC_REFLECTION" envDefault:"true"`

	// RunnerGRPCAddr serves the runner-facing RPCs (EventsService.Connect,
	// GitHubTokenService.IssueRepoToken) over mTLS; empty disables it.
	RunnerGRPCAddr string `env:"TASKRUNNER_RUNNER_GRPC_ADDR" envDefault:"127.0.0.1:7443"`
	// TLS material of the runner port: the server certificate and the
	// runner CA that signs task certificates (and, with its key, lets
	// Dispatch mint them).
	TLSCertFile     string `env:"TASKRUNNER_TLS_CERT_FILE"`
	TLSKeyFile      string `env:"TASKRUNNER_TLS_KEY_FILE"`
	RunnerCAFile    string `env:"TASKRUNNER_RUNNER_CA_FILE"`
	RunnerCAKeyFile string `env:"TASKRUNNER_RUNNER_CA_KEY_FILE"`
	TrustDomain     string `env:"TASKRUNNER_TRUST_DOMAIN" envDefault:"taskrunner.local"`
	RedisPrefix     string `env:"TASKRUNNER_REDIS_PREFIX"`
	// EventsCommitters is events.Config.Committers: the most group commits
	// at once (the second only when one cannot keep up); the default is
	// events.DefaultCommitters, measured with make bench-committers.
	EventsCommitters int `env:"TASKRUNNER_EVENTS_COMMITTERS" envDefault:"2"`
	// HeartbeatInterval is the one liveness setting: Events tells runners
	// to send a heartbeat this often (Welcome), and Dispatch's reaper fails
	// a running task after 3 intervals without anything from its runner.
	HeartbeatInterval time.Duration `env:"TASKRUNNER_HEARTBEAT_INTERVAL" envDefault:"10s"`
	// MaxRuns is the most runs a task may have: the first and its
	// follow-ups.
	MaxRuns int `env:"TASKRUNNER_MAX_RUNS" envDefault:"5"`

	// SandboxProvider selects where Dispatch runs tasks.
	SandboxProvider  string `env:"TASKRUNNER_SANDBOX_PROVIDER" envDefault:"process"`
	ProcessRunnerBin string `env:"TASKRUNNER_PROCESS_RUNNER_BIN" envDefault:"runner"`
	ProcessWorkRoot  string `env:"TASKRUNNER_PROCESS_WORK_ROOT" envDefault:".dev/sandboxes"`
	ProcessBwrap     string `env:"TASKRUNNER_PROCESS_BWRAP" envDefault:"auto"`

	// When TaskService and DispatchService run in different processes, the
	// Task side reaches Dispatch here, with an internal-scope token.
	DispatchAddr  string `env:"TASKRUNNER_DISPATCH_ADDR"`
	InternalToken string `env:"TASKRUNNER_INTERNAL_TOKEN"`
}

// TLSConfigured reports whether the runner port has its certificates.
func (d Daemon) TLSConfigured() bool {
	return d.TLSCertFile != "" && d.TLSKeyFile != "" && d.RunnerCAFile != ""
}

// Load reads the environment.
func Load() (Daemon, error) {
	var d Daemon
	if err := env.Parse(&d); err != nil {
		return d, fmt.Errorf("configuration: %w", err)
	}
	return d, nil
}

// ServiceList parses Services.
func (d Daemon) ServiceList() ([]string, error) {
	v := strings.TrimSpace(d.Services)
	if v == "all" || v == "" {
		return AllServices, nil
	}
	var out []string
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(AllServices, s) {
			return nil, fmt.Errorf("TASKRUNNER_SERVICES: unknown service %q (want a comma-separated subset of %s, or all)", s, strings.Join(AllServices, ","))
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out, nil
}

// Validate checks every field and names the bad variable.
func (d Daemon) Validate() error {
	if u, err := url.Parse(d.DatabaseURL); err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return fmt.Errorf("TASKRUNNER_DATABASE_URL: want postgres://user@host:port/db, got %q", Redact(d.DatabaseURL))
	}
	if u, err := url.Parse(d.RedisURL); err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") {
		return fmt.Errorf("TASKRUNNER_REDIS_URL: want redis://host:port/db, got %q", Redact(d.RedisURL))
	}
	if _, _, err := net.SplitHostPort(d.GRPCAddr); err != nil {
		return fmt.Errorf("TASKRUNNER_GRPC_ADDR: want host:port, got %q", d.GRPCAddr)
	}
	if _, err := d.ServiceList(); err != nil {
		return err
	}
	if _, err := ParseLevel(d.LogLevel); err != nil {
		return fmt.Errorf("TASKRUNNER_LOG_LEVEL: %w", err)
	}
	if d.LogFormat != "json" && d.LogFormat != "text" {
		return fmt.Errorf("TASKRUNNER_LOG_FORMAT: want json or text, got %q", d.LogFormat)
	}
	if d.ShutdownTimeout <= 0 {
		return fmt.Errorf("TASKRUNNER_SHUTDOWN_TIMEOUT: must be positive")
	}
	if d.RunnerGRPCAddr != "" {
		if _, _, err := net.SplitHostPort(d.RunnerGRPCAddr); err != nil {
			return fmt.Errorf("TASKRUNNER_RUNNER_GRPC_ADDR: want host:port, got %q", d.RunnerGRPCAddr)
		}
	}
	if d.HeartbeatInterval < time.Second || d.HeartbeatInterval%time.Second != 0 {
		return fmt.Errorf("TASKRUNNER_HEARTBEAT_INTERVAL: want whole seconds, at least 1s (runners are told it in seconds), got %s", d.HeartbeatInterval)
	}
	if d.MaxRuns < 1 || d.MaxRuns > 100 {
		return fmt.Errorf("TASKRUNNER_MAX_RUNS: want 1 to 100, got %d", d.MaxRuns)
	}
	if d.EventsCommitters < 1 || d.EventsCommitters > 64 {
		return fmt.Errorf("TASKRUNNER_EVENTS_COMMITTERS: want 1 to 64, got %d", d.EventsCommitters)
	}
	if (d.GRPCTLSCertFile == "") != (d.GRPCTLSKeyFile == "") {
		return fmt.Errorf("TASKRUNNER_GRPC_TLS_CERT_FILE and TASKRUNNER_GRPC_TLS_KEY_FILE must be set together")
	}
	if (d.TLSCertFile != "" || d.TLSKeyFile != "") && !d.TLSConfigured() {
		return fmt.Errorf("TASKRUNNER_TLS_CERT_FILE, TASKRUNNER_TLS_KEY_FILE and TASKRUNNER_RUNNER_CA_FILE must be set together")
	}
	switch d.SandboxProvider {
	case "process", "docker", "fly", "kubernetes", "boxlite":
	default:
		return fmt.Errorf("TASKRUNNER_SANDBOX_PROVIDER: unknown provider %q (want process, docker, fly, kubernetes or boxlite)", d.SandboxProvider)
	}
	if d.DispatchAddr != "" {
		if _, _, err := net.SplitHostPort(d.DispatchAddr); err != nil {
			return fmt.Errorf("TASKRUNNER_DISPATCH_ADDR: want host:port, got %q", d.DispatchAddr)
		}
		if d.InternalToken == "" {
			return fmt.Errorf("TASKRUNNER_INTERNAL_TOKEN: required with TASKRUNNER_DISPATCH_ADDR")
		}
	}
	return nil
}

// ParseLevel parses debug, info, warn or error.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}

// Redact hides the password of a URL for messages.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable)"
	}
	return u.Redacted()
}
