package devstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// Ports of the throwaway servers, away from the standard ones.
const (
	ThrowawayPostgresPort = 55432
	ThrowawayRedisPort    = 56379
)

// Dep is a dependency that is reachable, and how to stop it if we started it.
type Dep struct {
	URL     string
	Started bool
	stop    func()
}

// Stop stops a server we started; it does nothing for a server we found.
func (d *Dep) Stop() {
	if d != nil && d.stop != nil {
		d.stop()
	}
}

// Options control EnsurePostgres and EnsureRedis.
type Options struct {
	// Dir holds throwaway data (e.g. .dev).
	Dir string
	// AllowInstall lets us apt-get install missing server packages (root only).
	AllowInstall bool
	Logger       *slog.Logger
}

func pingPostgres(ctx context.Context, u string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	return c.Close(ctx)
}

func withDB(u, db string) string {
	p, err := url.Parse(u)
	if err != nil {
		return u
	}
	p.Path = "/" + db
	return p.String()
}

// EnsurePostgres returns a reachable PostgreSQL URL whose database exists.
// It tries want, then a throwaway server in Dir/postgres that it starts (and
// initialises) when needed. The database named in want is created if missing.
func EnsurePostgres(ctx context.Context, want string, o Options) (*Dep, error) {
	u, err := url.Parse(want)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	dbName := strings.TrimPrefix(u.Path, "/")
	if dbName == "" {
		dbName = "postgres"
	}
	admin := withDB(want, "postgres")
	if pingPostgres(ctx, admin) == nil {
		return &Dep{URL: want}, createDB(ctx, admin, dbName)
	}
	o.Logger.Info("no PostgreSQL answers; starting a throwaway one", "tried", redacted(want))
	throwURL := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", ThrowawayPostgresPort, dbName)
	throwAdmin := withDB(throwURL, "postgres")
	if pingPostgres(ctx, throwAdmin) == nil { // left running by an earlier run
		return &Dep{URL: throwURL}, createDB(ctx, throwAdmin, dbName)
	}
	bin, err := findPGBin(o)
	if err != nil {
		return nil, err
	}
	dataDir, err := filepath.Abs(filepath.Join(o.Dir, "postgres"))
	if err != nil {
		return nil, err
	}
	cred, owner, err := unprivileged()
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(dataDir, "PG_VERSION")); err != nil {
		if err := os.MkdirAll(dataDir, 0o700); err != nil {
			return nil, err
		}
		if err := chownTree(dataDir, owner); err != nil {
			return nil, err
		}
		if err := runAs(ctx, cred, filepath.Join(bin, "initdb"), "-D", dataDir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"); err != nil {
			return nil, fmt.Errorf("initdb: %w", err)
		}
	}
	logFile := filepath.Join(filepath.Dir(dataDir), "postgres.log")
	_ = touchOwned(logFile, owner)
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", ThrowawayPostgresPort, dataDir)
	if err := runAs(ctx, cred, filepath.Join(bin, "pg_ctl"), "-D", dataDir, "-l", logFile, "-o", opts, "-w", "-t", "60", "start"); err != nil {
		return nil, fmt.Errorf("pg_ctl start (log: %s): %w", logFile, err)
	}
	stop := func() {
		_ = runAs(context.Background(), cred, filepath.Join(bin, "pg_ctl"), "-D", dataDir, "-m", "fast", "-w", "stop")
	}
	if err := waitFor(ctx, 30*time.Second, func() error { return pingPostgres(ctx, throwAdmin) }); err != nil {
		stop()
		return nil, fmt.Errorf("throwaway PostgreSQL did not answer (log: %s): %w", logFile, err)
	}
	return &Dep{URL: throwURL, Started: true, stop: stop}, createDB(ctx, throwAdmin, dbName)
}

func createDB(ctx context.Context, admin, name string) error {
	if name == "postgres" {
		return nil
	}
	c, err := pgx.Connect(ctx, admin)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	var exists bool
	if err := c.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	_, err = c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	if err != nil && strings.Contains(err.Error(), "already exists") {
		return nil
	}
	return err
}

func findPGBin(o Options) (string, error) {
	find := func() string {
		if p, err := exec.LookPath("pg_ctl"); err == nil {
			if _, err := os.Stat(filepath.Join(filepath.Dir(p), "initdb")); err == nil {
				return filepath.Dir(p)
			}
		}
		matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
		if len(matches) > 0 {
			return filepath.Dir(matches[len(matches)-1])
		}
		return ""
	}
	if b := find(); b != "" {
		return b, nil
	}
	if err := aptInstall(o, "postgresql"); err != nil {
		return "", fmt.Errorf("PostgreSQL is not reachable and initdb/pg_ctl are not installed: install the Debian package `postgresql` (apt-get install postgresql) or set TASKRUNNER_DATABASE_URL to a running server (%w)", err)
	}
	if b := find(); b != "" {
		return b, nil
	}
	return "", errors.New("installed postgresql but initdb is still not found")
}

func aptInstall(o Options, pkgs ...string) error {
	if !o.AllowInstall {
		return errors.New("installing packages is not allowed here")
	}
	if os.Geteuid() != 0 {
		return errors.New("not root, so cannot apt-get install")
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return errors.New("apt-get not found")
	}
	o.Logger.Info("installing packages with apt-get", "packages", pkgs)
	for _, args := range [][]string{{"update"}, append([]string{"install", "-y", "--no-install-recommends"}, pkgs...)} {
		cmd := exec.Command("apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get %s: %w: %s", args[0], err, tail(string(out), 400))
		}
	}
	return nil
}

// unprivileged returns credentials to run servers that refuse root.
func unprivileged() (*syscall.Credential, [2]int, error) {
	if os.Geteuid() != 0 {
		return nil, [2]int{os.Getuid(), os.Getgid()}, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, [2]int{uid, gid}, nil
	}
	return nil, [2]int{}, errors.New("running as root and no postgres or nobody user exists to run PostgreSQL")
}

func chownTree(dir string, owner [2]int) error {
	if os.Geteuid() != 0 {
		return nil
	}
	// Parents must be traversable by the server's user.
	for d := filepath.Dir(dir); d != "/" && d != "."; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			_ = os.Chmod(d, fi.Mode().Perm()|0o011)
		}
	}
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, owner[0], owner[1])
	})
}

func touchOwned(path string, owner [2]int) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	_ = f.Close()
	if os.Geteuid() == 0 {
		return os.Chown(path, owner[0], owner[1])
	}
	return nil
}

func runAs(ctx context.Context, cred *syscall.Credential, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: %s", err, tail(string(out), 600))
	}
	return nil
}

func pingRedis(ctx context.Context, u string) error {
	opts, err := redis.ParseURL(u)
	if err != nil {
		return err
	}
	c := redis.NewClient(opts)
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return c.Ping(ctx).Err()
}

// EnsureRedis returns a reachable Redis URL, starting a throwaway server
// (no persistence) when want does not answer.
func EnsureRedis(ctx context.Context, want string, o Options) (*Dep, error) {
	if _, err := redis.ParseURL(want); err != nil {
		return nil, fmt.Errorf("redis URL: %w", err)
	}
	if pingRedis(ctx, want) == nil {
		return &Dep{URL: want}, nil
	}
	throwURL := fmt.Sprintf("redis://127.0.0.1:%d/0", ThrowawayRedisPort)
	if pingRedis(ctx, throwURL) == nil {
		return &Dep{URL: throwURL}, nil
	}
	o.Logger.Info("no Redis answers; starting a throwaway one", "tried", want)
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if ierr := aptInstall(o, "redis-server"); ierr != nil {
			return nil, fmt.Errorf("Redis is not reachable and redis-server is not installed: install the Debian package `redis-server` (apt-get install redis-server) or set TASKRUNNER_REDIS_URL to a running server (%v)", ierr)
		}
		if bin, err = exec.LookPath("redis-server"); err != nil {
			return nil, err
		}
	}
	dir, err := filepath.Abs(filepath.Join(o.Dir, "redis"))
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	pidFile := filepath.Join(dir, "redis.pid")
	cmd := exec.CommandContext(ctx, bin, "--port", strconv.Itoa(ThrowawayRedisPort), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--daemonize", "yes", "--pidfile", pidFile,
		"--logfile", filepath.Join(dir, "redis.log"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("redis-server: %w: %s", err, tail(string(out), 400))
	}
	stop := func() {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = syscall.Kill(pid, syscall.SIGTERM)
			}
		}
	}
	if err := waitFor(ctx, 20*time.Second, func() error { return pingRedis(ctx, throwURL) }); err != nil {
		stop()
		return nil, fmt.Errorf("throwaway Redis did not answer: %w", err)
	}
	return &Dep{URL: throwURL, Started: true, stop: stop}, nil
}

func waitFor(ctx context.Context, d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return err
}

// FreePort asks the kernel for an unused loopback port.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

func redacted(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparseable)"
	}
	return p.Redacted()
}
