package storetest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/taskrunner/taskrunner/services/store"
)

// Default addresses of the servers `make test` guarantees.
const (
	DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	DefaultRedisURL    = "redis://127.0.0.1:6379/0"
)

// DatabaseURL is the admin URL tests connect to.
func DatabaseURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultDatabaseURL
}

// RedisURL is the Redis tests use.
func RedisURL() string {
	if u := os.Getenv("TEST_REDIS_URL"); u != "" {
		return u
	}
	return DefaultRedisURL
}

// unavailable skips the test, or fails it when TASKRUNNER_REQUIRE_SERVICES is
// set (as `make test` does), so CI can never pass by skipping.
func unavailable(t testing.TB, what string, err error) {
	t.Helper()
	if os.Getenv("TASKRUNNER_REQUIRE_SERVICES") != "" {
		t.Fatalf("%s is required but not reachable: %v", what, err)
	}
	t.Skipf("%s not reachable (%v); run `make test` to start one", what, err)
}

var (
	templateOnce sync.Once
	templateName string
	templateErr  error
)

// migrationsHash names the template after the schema, so a changed migration
// never reuses a stale template.
func migrationsHash() string {
	h := sha256.New()
	_ = fs.WalkDir(store.Migrations(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := fs.ReadFile(store.Migrations(), path)
		h.Write([]byte(path))
		h.Write(b)
		return nil
	})
	return hex.EncodeToString(h.Sum(nil))[:12]
}

func withDatabase(admin, name string) string {
	u, err := url.Parse(admin)
	if err != nil {
		return admin
	}
	u.Path = "/" + name
	return u.String()
}

func ensureTemplate(ctx context.Context) (string, error) {
	templateOnce.Do(func() {
		name := "taskrunner_tmpl_" + migrationsHash()
		conn, err := pgx.Connect(ctx, DatabaseURL())
		if err != nil {
			templateErr = err
			return
		}
		defer conn.Close(ctx)
		// Several test binaries run at once: serialise template creation.
		if _, err = conn.Exec(ctx, "SELECT pg_advisory_lock(7261001)"); err != nil {
			templateErr = err
			return
		}
		defer conn.Exec(ctx, "SELECT pg_advisory_unlock(7261001)") //nolint:errcheck
		var exists bool
		if err = conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
			templateErr = err
			return
		}
		if !exists {
			building := name + "_building"
			_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{building}.Sanitize())
			if _, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{building}.Sanitize()); err != nil {
				templateErr = err
				return
			}
			pool, err := pgxpool.New(ctx, withDatabase(DatabaseURL(), building))
			if err != nil {
				templateErr = err
				return
			}
			_, err = store.Migrate(ctx, pool, slog.New(slog.DiscardHandler))
			pool.Close()
			if err != nil {
				templateErr = err
				return
			}
			if _, err = conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{building}.Sanitize()+" RENAME TO "+pgx.Identifier{name}.Sanitize()); err != nil {
				templateErr = err
				return
			}
		}
		templateName = name
	})
	return templateName, templateErr
}

func randomSuffix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// DB is a migrated database of the test's own.
type DB struct {
	Pool *pgxpool.Pool
	URL  string
	Name string
}

// NewDB creates a database for this test from the migrated template and drops
// it when the test ends.
func NewDB(t testing.TB) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tmpl, err := ensureTemplate(ctx)
	if err != nil {
		unavailable(t, "PostgreSQL", err)
	}
	name := "taskrunner_test_" + randomSuffix()
	conn, err := pgx.Connect(ctx, DatabaseURL())
	if err != nil {
		unavailable(t, "PostgreSQL", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s",
		pgx.Identifier{name}.Sanitize(), pgx.Identifier{tmpl}.Sanitize())); err != nil {
		t.Fatalf("create test database: %v", err)
	}
	dbURL := withDatabase(DatabaseURL(), name)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatalf("connect test database: %v", err)
	}
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, DatabaseURL())
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	return &DB{Pool: pool, URL: dbURL, Name: name}
}

// Redis is a client plus a key prefix of the test's own.
type Redis struct {
	Client *redis.Client
	URL    string
	Prefix string
}

// NewRedis connects to the test Redis and deletes the test's keys at the end.
func NewRedis(t testing.TB) *Redis {
	t.Helper()
	opts, err := redis.ParseURL(RedisURL())
	if err != nil {
		t.Fatalf("parse TEST_REDIS_URL: %v", err)
	}
	c := redis.NewClient(opts)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		unavailable(t, "Redis", err)
	}
	prefix := "test:" + randomSuffix() + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
		_ = c.Close()
	})
	return &Redis{Client: c, URL: RedisURL(), Prefix: strings.TrimSuffix(prefix, "")}
}
