package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/dunglas/mercure"
	"github.com/golang-jwt/jwt/v5"
)

// The reference hub of bench-sse: Mercure (github.com/dunglas/mercure) as a
// library, embedded in the server process behind its own HTTP listener,
// with the Bolt transport: like taskrunner's PostgreSQL log, it persists
// every update before fanning it out and replays history after a
// Last-Event-ID, so a subscriber cut off for being slow resumes without
// loss on both sides. Updates are private and every subscriber presents a
// JWT that allows exactly its task's topic, as taskrunner owner-checks
// every stream; the publisher holds a JWT that may publish anywhere.
const (
	mercurePath  = "/.well-known/mercure"
	mercureTopic = "https://bench.taskrunner.dev/tasks/"
)

// mercureHub is one Mercure hub on a loopback listener, fresh per
// scenario (a fresh Bolt file too, so history from one scenario never
// slows the next one's reconnects).
type mercureHub struct {
	hub    *mercure.Hub
	srv    *http.Server
	served chan struct{}
	dir    string
	URL    string // http://127.0.0.1:port/.well-known/mercure
	key    []byte
}

func startMercure(log *slog.Logger) (_ *mercureHub, err error) {
	m := &mercureHub{key: []byte(randomHex(32)), served: make(chan struct{})}
	if m.dir, err = os.MkdirTemp("", "bench-sse-mercure-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(m.dir)
		}
	}()
	tr, err := mercure.NewBoltTransport(mercure.NewSubscriberList(mercure.DefaultSubscriberListCacheSize), log,
		filepath.Join(m.dir, "updates.db"), "", 0, 0)
	if err != nil {
		return nil, fmt.Errorf("bench: mercure bolt transport: %w", err)
	}
	m.hub, err = mercure.NewHub(context.Background(),
		mercure.WithTransport(tr),
		mercure.WithLogger(log),
		mercure.WithPublisherJWT(m.key, jwt.SigningMethodHS256.Name),
		mercure.WithSubscriberJWT(m.key, jwt.SigningMethodHS256.Name),
		mercure.WithHeartbeat(15*time.Second), // taskrunner's default
	)
	if err != nil {
		_ = tr.Close(context.Background())
		return nil, fmt.Errorf("bench: mercure hub: %w", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = m.hub.Stop(context.Background())
		return nil, err
	}
	m.srv = &http.Server{Handler: m.hub, ReadHeaderTimeout: 10 * time.Second}
	go func() { defer close(m.served); _ = m.srv.Serve(lis) }()
	m.URL = "http://" + lis.Addr().String() + mercurePath
	return m, nil
}

// token signs Mercure claims: the topics this bearer may publish to and
// subscribe to.
func (m *mercureHub) token(publish, subscribe []string) (string, error) {
	claims := jwt.MapClaims{"mercure": map[string]any{"publish": publish, "subscribe": subscribe}, "exp": time.Now().Add(24 * time.Hour).Unix()}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(m.key)
}

// close stops the listener (the clients have closed their streams; a
// handler still running is cut off after 2 s), then the hub, and removes
// the Bolt file.
func (m *mercureHub) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var err error
	if serr := m.srv.Shutdown(ctx); serr != nil {
		err = m.srv.Close()
	}
	<-m.served
	return errors.Join(err, m.hub.Stop(context.Background()), os.RemoveAll(m.dir))
}
