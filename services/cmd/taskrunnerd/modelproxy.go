package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/taskrunner/taskrunner/services/config"
	"github.com/taskrunner/taskrunner/services/modelproxy"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/task"
)

// modelProxy serves services/modelproxy on its own HTTPS listener
// (TASKRUNNER_MODEL_PROXY_ADDR) when one is configured. It is a third door,
// not part of the runner port: the agent CLIs speak plain HTTP APIs
// (Anthropic Messages, OpenAI Responses), not gRPC, and keeping HTTP off the
// gRPC port keeps that port's "only the runner RPCs" rule simple. It admits
// only what the runner port admits: a client certificate of the runner CA,
// required in the handshake (requireClientCert); the proxy then serves a
// certificate only while its task runs. The listener is bound here, so a
// taken port fails the start; it serves until the daemon's context ends.
func (a *app) modelProxy(cfg config.Daemon, reloader *pki.Reloader, tasks *task.Store, logger *slog.Logger) error {
	var mc modelproxy.Config
	if err := env.Parse(&mc); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if mc.Addr == "" {
		return nil
	}
	if reloader == nil {
		return errors.New("TASKRUNNER_MODEL_PROXY_ADDR: the model proxy needs the TLS material (TASKRUNNER_TLS_CERT_FILE, TASKRUNNER_TLS_KEY_FILE, TASKRUNNER_RUNNER_CA_FILE)")
	}
	mc.TrustDomain = cfg.TrustDomain
	proxy, err := modelproxy.New(mc, tasks, nil, logger)
	if err != nil {
		return err
	}
	if mc.AnthropicKey == "" && mc.OpenAIKey == "" {
		logger.Warn("model proxy: neither ANTHROPIC_API_KEY nor OPENAI_API_KEY is set; calls go upstream without a key")
	}
	lis, err := net.Listen("tcp", mc.Addr)
	if err != nil {
		return fmt.Errorf("TASKRUNNER_MODEL_PROXY_ADDR: %w", err)
	}
	srv := &http.Server{Handler: proxy, TLSConfig: requireClientCert(pki.ServerTLSConfig(reloader)),
		ReadHeaderTimeout: 30 * time.Second, ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	logger.Info("model proxy listening (mTLS)", "addr", lis.Addr().String(), "anthropic_upstream", mc.AnthropicUpstream, "openai_upstream", mc.OpenAIUpstream)
	a.closers = append(a.closers, func() { _ = lis.Close() })
	a.background = append(a.background, func(ctx context.Context) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := srv.ServeTLS(lis, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error("model proxy stopped", "error", err)
			}
		}()
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
		}
		<-done
	})
	return nil
}
