package config

import (
	"fmt"
	"net"
	"time"

	"github.com/caarlos0/env/v11"
)

// Gateway is the gateway's configuration.
type Gateway struct {
	HTTPAddr        string        `env:"TASKRUNNER_HTTP_ADDR" envDefault:"127.0.0.1:8080"`
	TaskAddr        string        `env:"TASKRUNNER_TASK_ADDR" envDefault:"127.0.0.1:7070"`
	EventsAddr      string        `env:"TASKRUNNER_EVENTS_ADDR" envDefault:"127.0.0.1:7070"`
	MaxBodyBytes    int64         `env:"TASKRUNNER_MAX_BODY_BYTES" envDefault:"65536"`
	LogLevel        string        `env:"TASKRUNNER_LOG_LEVEL" envDefault:"info"`
	ShutdownTimeout time.Duration `env:"TASKRUNNER_SHUTDOWN_TIMEOUT" envDefault:"20s"`
	// InternalToken is an internal-scope API token the gateway uses for the
	// GitHub webhook (it advances tasks of any owner). Never a user's token.
	InternalToken string `env:"TASKRUNNER_GATEWAY_INTERNAL_TOKEN"`

	// Live events for SSE come straight from Redis pub/sub.
	RedisURL          string        `env:"TASKRUNNER_REDIS_URL" envDefault:"redis://127.0.0.1:6379/0"`
	RedisPrefix       string        `env:"TASKRUNNER_REDIS_PREFIX"`
	SSEHeartbeat      time.Duration `env:"TASKRUNNER_SSE_HEARTBEAT" envDefault:"15s"`
	SSEClientQueue    int           `env:"TASKRUNNER_SSE_CLIENT_QUEUE" envDefault:"512"`
	SSEWriteTimeout   time.Duration `env:"TASKRUNNER_SSE_WRITE_TIMEOUT" envDefault:"30s"`
	SSEStatusInterval time.Duration `env:"TASKRUNNER_SSE_STATUS_INTERVAL" envDefault:"30s"`
}

// Load reads the environment.
func Load() (Gateway, error) {
	var g Gateway
	if err := env.Parse(&g); err != nil {
		return g, fmt.Errorf("configuration: %w", err)
	}
	return g, nil
}

// Validate names the bad variable.
func (g Gateway) Validate() error {
	for name, v := range map[string]string{"TASKRUNNER_HTTP_ADDR": g.HTTPAddr, "TASKRUNNER_TASK_ADDR": g.TaskAddr, "TASKRUNNER_EVENTS_ADDR": g.EventsAddr} {
		if _, _, err := net.SplitHostPort(v); err != nil {
			return fmt.Errorf("%s: want host:port, got %q", name, v)
		}
	}
	if g.MaxBodyBytes < 40<<10 {
		return fmt.Errorf("TASKRUNNER_MAX_BODY_BYTES: must be at least 40960 (a 32 KiB prompt must fit), got %d", g.MaxBodyBytes)
	}
	if g.ShutdownTimeout <= 0 {
		return fmt.Errorf("TASKRUNNER_SHUTDOWN_TIMEOUT: must be positive")
	}
	return nil
}
