package main

import (
	"fmt"
	"log/slog"

	"github.com/caarlos0/env/v11"

	"github.com/taskrunner/taskrunner/services/config"
	"github.com/taskrunner/taskrunner/services/sandbox"
	"github.com/taskrunner/taskrunner/services/sandbox/boxlite"
	"github.com/taskrunner/taskrunner/services/sandbox/docker"
	"github.com/taskrunner/taskrunner/services/sandbox/fly"
	"github.com/taskrunner/taskrunner/services/sandbox/kubernetes"
)

// newRemoteProvider builds the docker, fly, kubernetes or boxlite provider
// from its TASKRUNNER_<PROVIDER>_* variables; a provider that cannot work
// with them fails here, at start, naming the setting.
func newRemoteProvider(cfg config.Daemon, logger *slog.Logger) (sandbox.Provider, error) {
	p, err := remoteProvider(cfg, logger)
	if err != nil {
		prefix := map[string]string{"docker": "DOCKER", "fly": "FLY", "kubernetes": "K8S", "boxlite": "BOXLITE"}[cfg.SandboxProvider]
		return nil, fmt.Errorf("TASKRUNNER_SANDBOX_PROVIDER=%s: %w (set the TASKRUNNER_%s_* variables, see README)", cfg.SandboxProvider, err, prefix)
	}
	return p, nil
}

func remoteProvider(cfg config.Daemon, logger *slog.Logger) (sandbox.Provider, error) {
	parse := func(v any) error {
		if err := env.Parse(v); err != nil {
			return fmt.Errorf("configuration: %w", err)
		}
		return nil
	}
	switch cfg.SandboxProvider {
	case "docker":
		var c docker.Config
		if err := parse(&c); err != nil {
			return nil, err
		}
		return docker.New(c, logger)
	case "fly":
		var c fly.Config
		if err := parse(&c); err != nil {
			return nil, err
		}
		return fly.New(c, logger)
	case "kubernetes":
		var c kubernetes.Config
		if err := parse(&c); err != nil {
			return nil, err
		}
		return kubernetes.New(c, logger)
	case "boxlite":
		var c boxlite.Config
		if err := parse(&c); err != nil {
			return nil, err
		}
		return boxlite.New(c, logger)
	}
	return nil, fmt.Errorf("TASKRUNNER_SANDBOX_PROVIDER: unknown provider %q", cfg.SandboxProvider)
}
