package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Open connects a pool to url and waits for nothing: callers decide how long
// to wait for the database (see Ping).
func Open(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// Migrate applies every embedded migration that has not been applied yet and
// returns the schema version afterwards.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (int64, error) {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	return migrateDB(ctx, db, logger)
}

func migrateDB(ctx context.Context, db *sql.DB, logger *slog.Logger) (int64, error) {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return 0, err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub)
	if err != nil {
		return 0, fmt.Errorf("migrations: %w", err)
	}
	results, err := p.Up(ctx)
	for _, r := range results {
		logger.Info("migration applied", "version", r.Source.Version, "path", r.Source.Path, "duration", r.Duration)
	}
	if err != nil {
		return 0, fmt.Errorf("migrate: %w", err)
	}
	return p.GetDBVersion(ctx)
}

// WithTx runs fn in a transaction at the given isolation level and retries it
// (Retry) when PostgreSQL reports a serialization failure or deadlock, so
// callers can use SERIALIZABLE where they need it without writing retry loops.
func WithTx(ctx context.Context, pool *pgxpool.Pool, iso pgx.TxIsoLevel, fn func(pgx.Tx) error) error {
	return Retry(ctx, func() error {
		return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: iso}, fn)
	})
}

// TxAttempts bounds the tries of a transaction that hits a serialization
// failure or a deadlock.
const TxAttempts = 5

// Retry is the one transaction retry: it calls fn (one whole transaction)
// again while it fails with a Retryable error, at most TxAttempts times in
// all, after a short jittered exponential backoff (5 ms, doubling, capped at
// 50 ms). It answers fn's last error, or ctx's cause once ctx ends.
func Retry(ctx context.Context, fn func() error) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = 5*time.Millisecond, 50*time.Millisecond
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		err := fn()
		if err != nil && !Retryable(err) {
			return struct{}{}, backoff.Permanent(err)
		}
		return struct{}{}, err
	}, backoff.WithBackOff(b), backoff.WithMaxTries(TxAttempts), backoff.WithMaxElapsedTime(0))
	return err
}

// Retryable reports whether err is a serialization failure or a deadlock,
// after which the whole transaction may simply be tried again.
func Retryable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "40001" || pgErr.Code == "40P01"
	}
	return false
}

// IsUniqueViolation reports whether err is a unique-constraint violation.
func IsUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// Migrations is the embedded migration folder, for tools and tests.
func Migrations() fs.FS {
	sub, _ := fs.Sub(migrations, "migrations")
	return sub
}
