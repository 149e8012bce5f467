package sse

import (
	"errors"
	"fmt"
	"time"
)

// Config holds the SSE settings. Zero values take the defaults below.
type Config struct {
	// RedisPrefix is prepended to every Redis channel name; it must equal
	// the Events service's RedisPrefix (may be empty).
	RedisPrefix string
	// Heartbeat is the interval of ": ping" comments that keep proxies
	// from closing an idle stream. Default 15s.
	Heartbeat time.Duration
	// ClientQueue is how many live events may wait for one client: the size
	// of each task's ring, which every client of the task reads at its own
	// position; a client that falls that far behind is cut off (it resumes
	// with Last-Event-ID). Default 512.
	ClientQueue int
	// WriteTimeout bounds one burst of writes to a client and its flush (a
	// batch of live events, a replay page, a heartbeat): a client that
	// cannot take it within half of it to all of it is disconnected (the
	// deadline is moved when half of it is used up). Default 30s.
	WriteTimeout time.Duration
	// StatusInterval is how often an open stream checks, through GetTask,
	// that its token and task are still good and whether its task finished
	// without a final event on its timeline (timelines written before
	// status_change existed). Default 30s.
	StatusInterval time.Duration
	// AuthTTL is how long a GetTask answer (the owner check) and a replay
	// page are shared between connections of the same token and task, so a
	// connect storm calls the services once per task instead of once per
	// connection. A revoked token or a changed owner is refused within it.
	// Default 2s; at most 10s.
	AuthTTL time.Duration
	// Retry is the reconnection delay suggested to clients ("retry:").
	// Default 3s.
	Retry time.Duration
	// ReplayPageSize is the ListEvents page size of replays (at most 1000,
	// the Events service's limit). Default 500.
	ReplayPageSize int
}

// Defaults.
const (
	DefaultHeartbeat      = 15 * time.Second
	DefaultClientQueue    = 512
	DefaultWriteTimeout   = 30 * time.Second
	DefaultStatusInterval = 30 * time.Second
	DefaultAuthTTL        = 2 * time.Second
	maxAuthTTL            = 10 * time.Second
	DefaultRetry          = 3 * time.Second
	DefaultReplayPageSize = 500
	maxReplayPageSize     = 1000
)

func (c Config) withDefaults() Config {
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.ClientQueue == 0 {
		c.ClientQueue = DefaultClientQueue
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.StatusInterval == 0 {
		c.StatusInterval = DefaultStatusInterval
	}
	if c.AuthTTL == 0 {
		c.AuthTTL = DefaultAuthTTL
	}
	if c.Retry == 0 {
		c.Retry = DefaultRetry
	}
	if c.ReplayPageSize == 0 {
		c.ReplayPageSize = DefaultReplayPageSize
	}
	return c
}

// Validate checks the configuration (after defaults are applied).
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.Heartbeat < 0 || c.Heartbeat > time.Hour {
		errs = append(errs, fmt.Errorf("sse: Heartbeat %s out of range (0, 1h]", c.Heartbeat))
	}
	if c.ClientQueue < 1 || c.ClientQueue > 1<<20 {
		errs = append(errs, fmt.Errorf("sse: ClientQueue %d out of range 1..%d", c.ClientQueue, 1<<20))
	}
	if c.WriteTimeout < 0 {
		errs = append(errs, fmt.Errorf("sse: WriteTimeout %s must be positive", c.WriteTimeout))
	}
	if c.StatusInterval < 0 {
		errs = append(errs, fmt.Errorf("sse: StatusInterval %s must be positive", c.StatusInterval))
	}
	if c.AuthTTL < 0 || c.AuthTTL > maxAuthTTL {
		errs = append(errs, fmt.Errorf("sse: AuthTTL %s out of range (0, %s]", c.AuthTTL, maxAuthTTL))
	}
	if c.Retry < 0 || c.Retry > time.Hour {
		errs = append(errs, fmt.Errorf("sse: Retry %s out of range (0, 1h]", c.Retry))
	}
	if c.ReplayPageSize < 1 || c.ReplayPageSize > maxReplayPageSize {
		errs = append(errs, fmt.Errorf("sse: ReplayPageSize %d out of range 1..%d", c.ReplayPageSize, maxReplayPageSize))
	}
	return errors.Join(errs...)
}
