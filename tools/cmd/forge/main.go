package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/taskrunner/taskrunner/platform/telemetry"
	"github.com/taskrunner/taskrunner/tools/forge"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	tel, err := telemetry.Setup(ctx, "forge")
	if err != nil {
		fmt.Fprintln(os.Stderr, "forge: telemetry (OTEL_* variables):", err)
		os.Exit(1)
	}
	err = run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = tel.Shutdown(sctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "forge:", err)
		os.Exit(1)
	}
}

// seeds collects repeatable --seed owner/name=DIR flags.
type seeds []string

func (s *seeds) String() string     { return strings.Join(*s, ",") }
func (s *seeds) Set(v string) error { *s = append(*s, v); return nil }

// run serves until ctx is done; it prints the URL, app id and key path once listening.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("forge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var seedFlags seeds
	addr := fs.String("addr", "127.0.0.1:3080", "listen address")
	dataDir := fs.String("data-dir", ".forge", "directory for bare repositories (and the app key by default)")
	fs.Var(&seedFlags, "seed", "owner/name=DIR: create repository owner/name from DIR unless it exists (repeatable)")
	var collaboratorFlags seeds
	fs.Var(&collaboratorFlags, "collaborator", "owner/name:user=role: give user a role (admin, maintain, write, triage, read) on a repository, after seeding (repeatable)")
	webhookURL := fs.String("webhook-url", "", "URL that receives the webhooks (pull_request, pull_request_review, pull_request_review_comment, issue_comment)")
	webhookSecret := fs.String("webhook-secret", "", "secret for X-Hub-Signature-256")
	appID := fs.Int64("app-id", 1, "GitHub App id (JWT iss)")
	clientID := fs.String("client-id", "Iv1.forge", "GitHub App client id (also accepted as JWT iss)")
	keyFile := fs.String("app-key-file", "", "PEM RSA private key of the app; generated when missing (default <data-dir>/app-key.pem)")
	personal := fs.String("personal-token", "", "personal access token with full access (empty: disabled)")
	ttl := fs.Duration("token-ttl", time.Hour, "lifetime of installation tokens")
	publicURL := fs.String("public-url", "", "external base URL for html_url/clone_url (default: from the request Host)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))

	if *keyFile == "" {
		*keyFile = filepath.Join(*dataDir, "app-key.pem")
	}
	key, created, err := forge.LoadOrCreateAppKey(*keyFile)
	if err != nil {
		return err
	}
	if created {
		log.Info("generated app key", "path", *keyFile)
	}
	f, err := forge.New(forge.Config{
		DataDir:       *dataDir,
		AppID:         *appID,
		ClientID:      *clientID,
		AppPublicKey:  &key.PublicKey,
		PersonalToken: *personal,
		TokenTTL:      *ttl,
		WebhookURL:    *webhookURL,
		WebhookSecret: *webhookSecret,
		PublicURL:     *publicURL,
		Logger:        log,
	})
	if err != nil {
		return err
	}
	defer f.Close()
	for _, s := range seedFlags {
		full, dir, ok := strings.Cut(s, "=")
		owner, name, ok2 := strings.Cut(full, "/")
		if !ok || !ok2 || dir == "" {
			return fmt.Errorf("--seed %q: want owner/name=DIR", s)
		}
		switch err := f.SeedFromDir(owner, name, dir); {
		case errors.Is(err, forge.ErrRepoExists):
			log.Info("repository exists, not seeding", "repo", full)
		case err != nil:
			return err
		}
	}
	for _, c := range collaboratorFlags {
		full, grant, ok := strings.Cut(c, ":")
		user, role, ok2 := strings.Cut(grant, "=")
		if !ok || !ok2 {
			return fmt.Errorf("--collaborator %q: want owner/name:user=role", c)
		}
		if err := f.SetCollaborator(full, user, role); err != nil {
			return fmt.Errorf("--collaborator %q: %w", c, err)
		}
	}

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	// Traced like GitHub's edge would be from the caller's side: the runner's
	// github.pr.create and git spans continue here.
	srv := &http.Server{Handler: otelhttp.NewHandler(f.Handler(), "forge",
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return "forge " + r.Method + " " + r.URL.Path })),
		ReadHeaderTimeout: 10 * time.Second}
	url := "http://" + ln.Addr().String()
	fmt.Fprintf(stdout, "forge listening on %s (REST at %s/ and %s/api/v3/, git at %s/{owner}/{repo}.git)\n", url, url, url, url)
	fmt.Fprintf(stdout, "app id: %d\napp key: %s\n", *appID, *keyFile)

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(shutdownCtx)
	<-errc
	log.Info("forge stopped")
	return err
}
