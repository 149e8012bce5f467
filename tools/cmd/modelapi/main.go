package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/taskrunner/taskrunner/tools/modelapi"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "modelapi:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("addr", "127.0.0.1:8089", "listen address")
	scriptPath := flag.String("script", "", "YAML script file with the scripted answers (required)")
	flag.Parse()
	if *scriptPath == "" {
		return errors.New("--script is required")
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	script, err := modelapi.LoadScript(*scriptPath)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: modelapi.New(script, log), ReadHeaderTimeout: 10 * time.Second}
	fmt.Printf("http://%s\n", ln.Addr())
	log.Info("modelapi listening", "url", "http://"+ln.Addr().String(), "script", *scriptPath)

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("modelapi stopping")
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
