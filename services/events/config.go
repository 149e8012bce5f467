package events

import (
	"errors"
	"fmt"
	"time"
)

// ProtocolVersion is the runner protocol version this server speaks.
const ProtocolVersion = 1

// Config holds the Events service settings. Zero values take the defaults
// below (see withDefaults); Validate rejects nonsense.
type Config struct {
	// TrustDomain is the SPIFFE trust domain of runner certificates
	// (spiffe://<trust-domain>/task/<id>). Required.
	TrustDomain string
	// RedisPrefix is prepended to every Redis channel name (may be empty).
	RedisPrefix string
	// HeartbeatInterval is sent to runners in Welcome. Default 10s.
	HeartbeatInterval time.Duration
	// HelloTimeout bounds the wait for a runner's Hello. Default 30s.
	HelloTimeout time.Duration
	// MaxBatch is the most events one group-commit transaction holds.
	// Default 500.
	MaxBatch int
	// MaxBatchDelay is how long the committer waits for more events after
	// the first one of a batch. The default, 0, commits whatever has
	// arrived at once: under load a batch still forms while the previous
	// commit runs, and a wait would only add its length (and a timer's
	// wake-up) to every event's latency. A positive delay trades latency
	// for fewer, larger transactions.
	MaxBatchDelay time.Duration
	// MaxEventBytes bounds one event's JSON form. Default 64 KiB.
	MaxEventBytes int
	// Committers is the most group commits at once. The first committer
	// takes whatever is waiting; the others take work only while a fifth of
	// a full batch waits, which happens only when one committer cannot keep
	// up (intake), so at light load there is one transaction at a time and
	// more committers cost nothing. A task's events are in one committer's
	// batch at a time, in order. Default DefaultCommitters.
	Committers int
	// QueueSize bounds the events waiting for a committer; a full intake
	// slows the runner streams down (gRPC flow control). Default 4096.
	QueueSize int
	// PageBytes bounds the payload bytes of a ListEvents page and of a
	// replay read. Default (and maximum) MaxPageBytes; tests set less.
	PageBytes int
}

func (c Config) maxPageBytes() int {
	if c.PageBytes <= 0 || c.PageBytes > MaxPageBytes {
		return MaxPageBytes
	}
	return c.PageBytes
}

// Defaults.
const (
	DefaultHeartbeatInterval = 10 * time.Second
	DefaultHelloTimeout      = 30 * time.Second
	DefaultMaxBatch          = 500
	DefaultMaxEventBytes     = 64 << 10
	DefaultQueueSize         = 4096
	// DefaultCommitters is 2, from make bench-committers (tools/bench/README.md):
	// with PostgreSQL, Redis, the servers and every client pinned to 2
	// cores, 2 committers took the unpaced ingest from 45,455 to 55,547
	// acked events/s (median of 3 rounds; 4 and 8 gave 54,732 and 54,128)
	// with the same paced p99 (21.7 ms against 30.3 for 1); on 1 core 1, 2,
	// 4 and 8 were alike (31-33k). It is a fixed number, not one per core:
	// the gain on 2 cores stopped at 2, 4 cores could not be measured here,
	// and where PostgreSQL runs on its own host its cores matter, not ours.
	DefaultCommitters = 2
)

func (c Config) withDefaults() Config {
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.HelloTimeout == 0 {
		c.HelloTimeout = DefaultHelloTimeout
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.MaxEventBytes == 0 {
		c.MaxEventBytes = DefaultMaxEventBytes
	}
	if c.Committers == 0 {
		c.Committers = DefaultCommitters
	}
	if c.QueueSize == 0 {
		c.QueueSize = DefaultQueueSize
	}
	return c
}

// Validate checks the configuration (after defaults are applied).
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.TrustDomain == "" {
		errs = append(errs, errors.New("events: TrustDomain is required"))
	}
	if c.HeartbeatInterval < time.Second || c.HeartbeatInterval > time.Hour {
		errs = append(errs, fmt.Errorf("events: HeartbeatInterval %s out of range 1s..1h", c.HeartbeatInterval))
	}
	if c.HelloTimeout < 0 {
		errs = append(errs, fmt.Errorf("events: HelloTimeout %s must be positive", c.HelloTimeout))
	}
	if c.MaxBatch < 1 || c.MaxBatch > 10000 {
		errs = append(errs, fmt.Errorf("events: MaxBatch %d out of range 1..10000", c.MaxBatch))
	}
	if c.MaxBatchDelay < 0 || c.MaxBatchDelay > time.Second {
		errs = append(errs, fmt.Errorf("events: MaxBatchDelay %s out of range 0..1s", c.MaxBatchDelay))
	}
	if c.MaxEventBytes < 1024 {
		errs = append(errs, fmt.Errorf("events: MaxEventBytes %d below 1024", c.MaxEventBytes))
	}
	if c.Committers < 1 || c.Committers > 64 {
		errs = append(errs, fmt.Errorf("events: Committers %d out of range 1..64", c.Committers))
	}
	if c.QueueSize < 1 {
		errs = append(errs, fmt.Errorf("events: QueueSize %d must be positive", c.QueueSize))
	}
	return errors.Join(errs...)
}
