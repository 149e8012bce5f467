package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/config"
	"github.com/taskrunner/taskrunner/services/events"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/rpcserver"
)

// One door per port. The public port (TASKRUNNER_GRPC_ADDR) authenticates
// callers by bearer token; the runner port (TASKRUNNER_RUNNER_GRPC_ADDR)
// authenticates them by client certificate at the TLS layer. Each serves
// only its own RPCs, so a weakness in one kind of authentication cannot
// reach the RPCs of the other: a runner's certificate opens no public RPC,
// and a bearer token (or no credential at all) opens no runner RPC.

// runnerRPCs are the RPCs runners call, and the only ones the runner port
// serves (besides gRPC health). A future model proxy joins this list.
var runnerRPCs = []string{
	taskrunnerv1.EventsService_Connect_FullMethodName,
	taskrunnerv1.EventsService_SaveSession_FullMethodName,
	taskrunnerv1.EventsService_LoadSession_FullMethodName,
	taskrunnerv1.GitHubTokenService_IssueRepoToken_FullMethodName,
}

// service is one gRPC service and its implementation.
type service struct {
	desc *grpc.ServiceDesc
	impl any
}

// publicPort builds a.public: every service without the runner RPCs, behind
// bearer-token authentication (no RPC is anonymous), optionally over TLS,
// with reflection unless switched off.
func (a *app) publicPort(cfg config.Daemon, logger *slog.Logger, tokens *auth.Store, services []service) error {
	opts := rpcserver.Options{Logger: logger, Auth: tokens, Reflection: cfg.GRPCReflection}
	if cfg.GRPCTLSCertFile != "" {
		// Loaded once: rotating the public certificate takes a restart
		// (rolling, behind a load balancer), unlike the runner port's.
		cert, err := tls.LoadX509KeyPair(cfg.GRPCTLSCertFile, cfg.GRPCTLSKeyFile)
		if err != nil {
			return fmt.Errorf("TASKRUNNER_GRPC_TLS_CERT_FILE / TASKRUNNER_GRPC_TLS_KEY_FILE: %w", err)
		}
		opts.ServerOptions = append(opts.ServerOptions, grpc.Creds(credentials.NewTLS(&tls.Config{
			MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert},
		})))
	}
	a.public = rpcserver.New(opts)
	var names []string
	for _, s := range services {
		desc := rpcserver.Without(s.desc, runnerRPCs...)
		if len(desc.Methods)+len(desc.Streams) == 0 {
			continue
		}
		a.public.RegisterService(desc, s.impl)
		names = append(names, desc.ServiceName)
	}
	a.health = rpcserver.NewHealth(a.public, names)
	return nil
}

// runnerPort builds a.runner: only the runner RPCs of the configured
// services, no reflection, and a TLS handshake that fails without a client
// certificate of the runner CA (the RPCs then check that the certificate's
// task is live and is the one asked about). The RPCs skip bearer-token
// authentication: the certificate is the credential.
func (a *app) runnerPort(logger *slog.Logger, reloader *pki.Reloader, services []service) {
	anonymous := map[string]bool{}
	for _, m := range runnerRPCs {
		anonymous[m] = true
	}
	opts := rpcserver.Options{Logger: logger, Anonymous: anonymous,
		ServerOptions: append(events.ServerOptions(), grpc.Creds(credentials.NewTLS(requireClientCert(pki.ServerTLSConfig(reloader)))))}
	a.runner = rpcserver.New(opts)
	var names []string
	for _, s := range services {
		var mine []string
		for _, m := range runnerRPCs {
			if hasMethod(s.desc, m) {
				mine = append(mine, m)
			}
		}
		if len(mine) == 0 {
			continue
		}
		a.runner.RegisterService(rpcserver.Subset(s.desc, mine...), s.impl)
		names = append(names, s.desc.ServiceName)
	}
	a.runnerHealth = rpcserver.NewHealth(a.runner, names)
}

// requireClientCert turns pki's server config, which accepts connections
// without a certificate, into one that refuses them in the handshake: the
// runner port has no RPC for a caller without one. The per-handshake config
// is kept (it carries the reloaded CA pool).
func requireClientCert(c *tls.Config) *tls.Config {
	perHandshake := c.GetConfigForClient
	c.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		hc, err := perHandshake(hello)
		if err != nil {
			return nil, err
		}
		if hc == nil {
			// The outer config has no CA pool; never fall back to it.
			return nil, errors.New("runner port: no TLS configuration for this handshake")
		}
		hc.ClientAuth = tls.RequireAndVerifyClientCert
		return hc, nil
	}
	c.ClientAuth = tls.RequireAndVerifyClientCert
	return c
}

func hasMethod(desc *grpc.ServiceDesc, fullMethod string) bool {
	for _, m := range desc.Methods {
		if "/"+desc.ServiceName+"/"+m.MethodName == fullMethod {
			return true
		}
	}
	for _, s := range desc.Streams {
		if "/"+desc.ServiceName+"/"+s.StreamName == fullMethod {
			return true
		}
	}
	return false
}
