package dispatch

import (
	"errors"
	"fmt"
	"time"
)

// Config holds the limits and the runner's settings. Env tags make it the
// single list of variables the deploy tests check.
type Config struct {
	PerOwnerPerDay int           `env:"TASKRUNNER_DISPATCH_PER_OWNER_PER_DAY" envDefault:"20"`
	PerRepoRunning int           `env:"TASKRUNNER_DISPATCH_PER_REPO_RUNNING" envDefault:"3"`
	GlobalRunning  int           `env:"TASKRUNNER_DISPATCH_GLOBAL_RUNNING" envDefault:"10"`
	TaskTimeout    time.Duration `env:"TASKRUNNER_TASK_TIMEOUT" envDefault:"30m"`
	// HeartbeatInterval is config.Daemon's TASKRUNNER_HEARTBEAT_INTERVAL
	// (set by the daemon, shared with Events): the reaper's unit of silence.
	HeartbeatInterval time.Duration
	ReaperInterval    time.Duration `env:"TASKRUNNER_REAPER_INTERVAL" envDefault:"15s"`
	OrphanGrace       time.Duration `env:"TASKRUNNER_ORPHAN_GRACE" envDefault:"2m"`
	CancelGrace       time.Duration `env:"TASKRUNNER_CANCEL_GRACE" envDefault:"15s"`
	// Runner settings passed into every sandbox.
	RunnerImage      string  `env:"TASKRUNNER_RUNNER_IMAGE" envDefault:"ghcr.io/taskrunner/runner:0.1.0"`
	RunnerCPUs       float64 `env:"TASKRUNNER_RUNNER_CPUS" envDefault:"2"`
	RunnerMemoryMB   int     `env:"TASKRUNNER_RUNNER_MEMORY_MB" envDefault:"4096"`
	RunnerEventsAddr string  `env:"TASKRUNNER_RUNNER_EVENTS_ADDR" envDefault:"127.0.0.1:7443"`
	RunnerTokenAddr  string  `env:"TASKRUNNER_RUNNER_TOKEN_ADDR"`
	RunnerServerName string  `env:"TASKRUNNER_RUNNER_SERVER_NAME" envDefault:"localhost"`
	MaxTurns         int     `env:"TASKRUNNER_MAX_TURNS" envDefault:"60"`
	MaxBudgetUSD     float64 `env:"TASKRUNNER_MAX_BUDGET_USD" envDefault:"5"`
	// PassEnv names variables of this process copied into the sandbox
	// (telemetry settings). Credentials never pass: model keys stay with
	// the model proxy, GitHub tokens with GitHubTokenService (RunnerEnv
	// drops them even when listed here).
	PassEnv []string `env:"TASKRUNNER_RUNNER_PASS_ENV" envDefault:"OTEL_EXPORTER_OTLP_ENDPOINT,OTEL_EXPORTER_OTLP_PROTOCOL"`
	// ModelProxyAddr is taskrunnerd's model proxy listener
	// (services/modelproxy); RunnerModelProxyAddr is the address runners
	// dial for it (default: ModelProxyAddr). Empty: runners get no model
	// access at all, since no key enters a sandbox.
	ModelProxyAddr       string `env:"TASKRUNNER_MODEL_PROXY_ADDR"`
	RunnerModelProxyAddr string `env:"TASKRUNNER_RUNNER_MODEL_PROXY_ADDR"`
	// OwnerDailyUSD is what one owner's tasks created since 00:00 UTC may
	// have spent on model calls before Dispatch refuses the owner's next
	// task until midnight (0: no quota).
	OwnerDailyUSD float64 `env:"TASKRUNNER_OWNER_DAILY_USD" envDefault:"0"`
}

// Validate names the bad variable.
func (c Config) Validate() error {
	switch {
	case c.PerOwnerPerDay < 1:
		return errors.New("TASKRUNNER_DISPATCH_PER_OWNER_PER_DAY: must be at least 1")
	case c.PerRepoRunning < 1:
		return errors.New("TASKRUNNER_DISPATCH_PER_REPO_RUNNING: must be at least 1")
	case c.GlobalRunning < 1:
		return errors.New("TASKRUNNER_DISPATCH_GLOBAL_RUNNING: must be at least 1")
	case c.TaskTimeout < time.Minute/2:
		return fmt.Errorf("TASKRUNNER_TASK_TIMEOUT: %s is too short", c.TaskTimeout)
	case c.HeartbeatInterval < 0:
		return errors.New("dispatch: the heartbeat interval must not be negative")
	case c.ReaperInterval <= 0:
		return errors.New("TASKRUNNER_REAPER_INTERVAL: must be positive")
	case c.OrphanGrace < 0 || c.CancelGrace < 0:
		return errors.New("TASKRUNNER_ORPHAN_GRACE / TASKRUNNER_CANCEL_GRACE: must not be negative")
	case c.RunnerEventsAddr == "":
		return errors.New("TASKRUNNER_RUNNER_EVENTS_ADDR: runners need the Events address")
	case c.MaxTurns < 1:
		return errors.New("TASKRUNNER_MAX_TURNS: must be at least 1")
	case c.MaxBudgetUSD <= 0:
		return errors.New("TASKRUNNER_MAX_BUDGET_USD: must be positive")
	case c.OwnerDailyUSD < 0:
		return errors.New("TASKRUNNER_OWNER_DAILY_USD: must not be negative (0: no quota)")
	}
	return nil
}
