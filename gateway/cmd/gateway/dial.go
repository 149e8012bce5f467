package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/caarlos0/env/v11"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// usage is what --help prints: the gateway has no flags, only environment
// variables, whose values help never shows.
const usage = `usage: gateway

Serves the public REST API, SSE, the GitHub webhook and the console, and
calls taskrunnerd's public gRPC port. Configuration comes from environment
variables (README.md lists them all), among them:

  TASKRUNNER_HTTP_ADDR                 where to listen (default 127.0.0.1:8080)
  TASKRUNNER_TASK_ADDR                 taskrunnerd's public gRPC port (default 127.0.0.1:7070)
  TASKRUNNER_EVENTS_ADDR               EventsService, if elsewhere (default: TASKRUNNER_TASK_ADDR's)
  TASKRUNNER_GRPC_CA_FILE              PEM CA bundle: dial taskrunnerd with TLS, verified against it
                                       (default: plaintext, for local development)
  TASKRUNNER_GRPC_TLS                  true: dial with TLS, verified against the system roots
  TASKRUNNER_REDIS_URL                 Redis, for live SSE events
  TASKRUNNER_GITHUB_WEBHOOK_SECRET     enables POST /v1/webhooks/github
  TASKRUNNER_GATEWAY_INTERNAL_TOKEN    internal-scope API token for the webhook
`

// grpcDial is how the gateway reaches taskrunnerd's public port.
type grpcDial struct {
	CAFile string `env:"TASKRUNNER_GRPC_CA_FILE"`
	TLS    bool   `env:"TASKRUNNER_GRPC_TLS"`
}

// transportCredentials returns plaintext unless TLS is asked for, by a CA
// file or TASKRUNNER_GRPC_TLS=true.
func transportCredentials() (credentials.TransportCredentials, error) {
	var d grpcDial
	if err := env.Parse(&d); err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	if d.CAFile == "" && !d.TLS {
		return insecure.NewCredentials(), nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if d.CAFile != "" {
		pem, err := os.ReadFile(d.CAFile)
		if err != nil {
			return nil, fmt.Errorf("TASKRUNNER_GRPC_CA_FILE: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("TASKRUNNER_GRPC_CA_FILE: no PEM certificate in %s", d.CAFile)
		}
	}
	return credentials.NewTLS(cfg), nil
}
