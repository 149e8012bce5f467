package faults

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/eventsclient"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/task"
)

const trustDomain = "faults.taskrunner.local"

func TestMain(m *testing.M) {
	if os.Getenv("TASKRUNNER_FAULTS") != "1" {
		fmt.Println("faults: skipped (run with make test-faults, or TASKRUNNER_FAULTS=1)")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// postgres is a throwaway PostgreSQL of one test.
type postgres struct {
	t       testing.TB
	bin     string
	dataDir string
	port    int
	cred    *syscall.Credential
	URL     string
}

func pgBin(t testing.TB) string {
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	sort.Strings(matches)
	if len(matches) == 0 {
		p, err := exec.LookPath("pg_ctl")
		require.NoError(t, err, "PostgreSQL server binaries (pg_ctl, initdb) are needed")
		return filepath.Dir(p)
	}
	return filepath.Dir(matches[len(matches)-1])
}

// unprivileged is the user PostgreSQL runs as when we are root (it refuses
// to run as root).
func unprivileged(t testing.TB) (*syscall.Credential, int, int) {
	if os.Getuid() != 0 {
		return nil, os.Getuid(), os.Getgid()
	}
	u, err := user.Lookup("nobody")
	require.NoError(t, err)
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, uid, gid
}

func (p *postgres) run(args ...string) error {
	cmd := exec.Command(filepath.Join(p.bin, args[0]), args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", args[0], err, out)
	}
	return nil
}

func startPostgres(t testing.TB) *postgres {
	dir, err := os.MkdirTemp("", "faults-pg-")
	require.NoError(t, err)
	cred, uid, gid := unprivileged(t)
	require.NoError(t, os.Chown(dir, uid, gid))
	require.NoError(t, os.Chmod(dir, 0o700))
	p := &postgres{t: t, bin: pgBin(t), dataDir: filepath.Join(dir, "data"), port: freePort(t), cred: cred}
	p.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
	require.NoError(t, p.run("initdb", "-D", p.dataDir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"))
	p.start()
	t.Cleanup(func() {
		_ = p.run("pg_ctl", "-D", p.dataDir, "-m", "immediate", "-w", "stop")
		_ = os.RemoveAll(dir)
	})
	return p
}

func (p *postgres) start() {
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200", p.port, p.dataDir)
	require.NoError(p.t, p.run("pg_ctl", "-D", p.dataDir, "-l", filepath.Join(p.dataDir, "..", "log"), "-o", opts, "-w", "-t", "60", "start"))
}

// stop is an operator's fast shutdown: sessions end with 57P01.
func (p *postgres) stop() {
	require.NoError(p.t, p.run("pg_ctl", "-D", p.dataDir, "-m", "fast", "-w", "stop"))
}

// redisServer is a throwaway Redis of one test.
type redisServer struct {
	t    testing.TB
	port int
	cmd  *exec.Cmd
	URL  string
}

func startRedis(t testing.TB) *redisServer {
	r := &redisServer{t: t, port: freePort(t)}
	r.URL = fmt.Sprintf("redis://127.0.0.1:%d/0", r.port)
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *redisServer) start() {
	r.cmd = exec.Command("redis-server", "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	require.NoError(r.t, r.cmd.Start())
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.port)})
	defer c.Close()
	require.Eventually(r.t, func() bool { return c.Ping(context.Background()).Err() == nil }, 20*time.Second, 20*time.Millisecond)
}

func (r *redisServer) stop() {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
		r.cmd = nil
	}
}

// binDir holds the real binaries: TASKRUNNER_BIN_DIR (make build's
// .dev/bin) or a fresh build.
func binDir(t testing.TB) string {
	if d := os.Getenv("TASKRUNNER_BIN_DIR"); d != "" {
		require.FileExists(t, filepath.Join(d, "taskrunnerd"))
		return d
	}
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+"/", "./services/cmd/taskrunnerd", "./gateway/cmd/gateway")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	return dir
}

// stack is one test's control plane: its PostgreSQL, Redis and taskrunnerd.
type stack struct {
	t                    testing.TB
	pg                   *postgres
	rds                  *redisServer
	bin, dir             string
	env                  []string
	grpcAddr, runnerAddr string
	cmd                  *exec.Cmd
	exited               chan struct{}
	pool                 *pgxpool.Pool
	ca                   *pki.CA
	serverCA             *pki.CA
	tasks                *task.Store
	token                string
	heartbeat            time.Duration
	gatewayPID           int // the real gateway's, once gateway() started it
}

func newStack(t testing.TB, opts ...func(*stack)) *stack {
	s := &stack{t: t, pg: startPostgres(t), rds: startRedis(t), bin: binDir(t), dir: t.TempDir(), heartbeat: 2 * time.Second}
	for _, o := range opts {
		o(s)
	}
	paths, err := pki.InitDev(filepath.Join(s.dir, "pki"), trustDomain, nil)
	require.NoError(t, err)
	s.ca, err = pki.LoadCAFiles(paths.CACert, paths.CAKey)
	require.NoError(t, err)
	s.grpcAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s.runnerAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s.env = []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + s.dir,
		"TASKRUNNER_DATABASE_URL=" + s.pg.URL, "TASKRUNNER_REDIS_URL=" + s.rds.URL,
		"TASKRUNNER_SERVICES=task,dispatch,events",
		"TASKRUNNER_GRPC_ADDR=" + s.grpcAddr, "TASKRUNNER_RUNNER_GRPC_ADDR=" + s.runnerAddr,
		"TASKRUNNER_TLS_CERT_FILE=" + paths.ServerCert, "TASKRUNNER_TLS_KEY_FILE=" + paths.ServerKey,
		"TASKRUNNER_RUNNER_CA_FILE=" + paths.CACert, "TASKRUNNER_RUNNER_CA_KEY_FILE=" + paths.CAKey,
		"TASKRUNNER_TRUST_DOMAIN=" + trustDomain, "TASKRUNNER_RUNNER_EVENTS_ADDR=" + s.runnerAddr,
		"TASKRUNNER_RUNNER_SERVER_NAME=localhost",
		"TASKRUNNER_HEARTBEAT_INTERVAL=" + s.heartbeat.String(), "TASKRUNNER_REAPER_INTERVAL=1s",
		"TASKRUNNER_PROCESS_RUNNER_BIN=" + s.runnerBin(), "TASKRUNNER_PROCESS_WORK_ROOT=" + filepath.Join(s.dir, "sandboxes"),
		"TASKRUNNER_PROCESS_BWRAP=never", "TASKRUNNER_PROCESS_UNISOLATED=1",
		"TASKRUNNER_LOG_LEVEL=info",
	}
	s.migrate()
	s.pool, err = pgxpool.New(context.Background(), s.pg.URL)
	require.NoError(t, err)
	t.Cleanup(s.pool.Close)
	s.tasks = task.NewStore(s.pool)
	plain, _, err := auth.NewStore(s.pool).Create(context.Background(), "alice", []string{auth.ScopeTasks}, "faults")
	require.NoError(t, err)
	s.token = plain
	s.start()
	t.Cleanup(func() { s.kill() })
	return s
}

func (s *stack) migrate() {
	cmd := exec.Command(filepath.Join(s.bin, "taskrunnerd"), "migrate")
	cmd.Env = s.env
	out, err := cmd.CombinedOutput()
	require.NoError(s.t, err, string(out))
}

// start runs taskrunnerd and waits until its runner port accepts.
func (s *stack) start() time.Time {
	log, err := os.OpenFile(filepath.Join(s.dir, "taskrunnerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	require.NoError(s.t, err)
	s.cmd = exec.Command(filepath.Join(s.bin, "taskrunnerd"), "serve")
	s.cmd.Env = s.env
	s.cmd.Stdout, s.cmd.Stderr = log, log
	require.NoError(s.t, s.cmd.Start())
	s.exited = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { _ = c.Wait(); _ = log.Close(); close(done) }(s.cmd, s.exited)
	require.Eventually(s.t, func() bool {
		c, err := net.DialTimeout("tcp", s.runnerAddr, 100*time.Millisecond)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	}, 60*time.Second, 10*time.Millisecond, "taskrunnerd never listened; log:\n%s", s.logTail())
	return time.Now()
}

// kill is kill -9 of taskrunnerd.
func (s *stack) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
	s.cmd = nil
}

func (s *stack) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "taskrunnerd.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// runningTask creates a task and moves it to running as Dispatch does, with
// a sandbox row the fake runner stands for.
func (s *stack) runningTask(deadline time.Duration) string {
	ctx := context.Background()
	tk, _, err := s.tasks.Create(ctx, task.NewTask{Owner: "alice", Repo: "acme/widgets", BaseBranch: "main", Prompt: "faults", Agent: task.AgentClaude}, "")
	require.NoError(s.t, err)
	_, err = s.pool.Exec(ctx, `INSERT INTO sandboxes (task_id, provider, external_id, state) VALUES ($1, 'fake', $2, 'running')`, tk.ID, "fake-"+tk.ID)
	require.NoError(s.t, err)
	_, applied, err := s.tasks.Advance(ctx, tk.ID, "", task.Advance{Status: task.StatusRunning, RequestID: "dispatch:run", Actor: task.ActorDispatch})
	require.NoError(s.t, err)
	require.True(s.t, applied)
	_, err = s.pool.Exec(ctx, `UPDATE tasks SET deadline_at = now() + $2::interval, heartbeat_at = now() WHERE id = $1`, tk.ID, deadline.String())
	require.NoError(s.t, err)
	return tk.ID
}

// runner is a fake runner of taskID: the real event stream client.
func (s *stack) runner(taskID string) *eventsclient.Client {
	c, _ := s.killableRunner(taskID)
	return c
}

// killableRunner is runner plus a kill: the stream stops at once, nothing
// more is sent, as when the runner's process dies.
func (s *stack) killableRunner(taskID string) (*eventsclient.Client, func()) {
	certPEM, keyPEM, err := s.ca.MintTaskCert(taskID, time.Now().Add(time.Hour))
	require.NoError(s.t, err)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(s.t, err)
	c, err := eventsclient.New(eventsclient.Config{
		Addr: "passthrough:///" + s.runnerAddr, TaskID: taskID,
		TLS:    &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, RootCAs: s.ca.Pool(), ServerName: "localhost"},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(s.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	c.Start(ctx)
	s.t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer ccancel()
		_ = c.Close(cctx)
		cancel()
	})
	return c, cancel
}

// client is a bearer-token gRPC client of the public port.
func (s *stack) client() (taskrunnerv1.EventsServiceClient, context.Context) {
	// The public port is plaintext here (loopback; TLS there is optional).
	cc, err := grpc.NewClient("passthrough:///"+s.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(4<<20)))
	require.NoError(s.t, err)
	s.t.Cleanup(func() { _ = cc.Close() })
	return taskrunnerv1.NewEventsServiceClient(cc), metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+s.token)
}

// timeline checks a task's stored timeline: seqs 1..N without a gap, every
// runner seq 1..runnerEvents exactly once. It returns N.
func (s *stack) timeline(taskID string, runnerEvents int64) int64 {
	s.t.Helper()
	ctx := context.Background()
	var n, top, rn, rdistinct, rlo, rhi int64
	require.NoError(s.t, s.pool.QueryRow(ctx, `SELECT count(*), coalesce(max(seq), 0) FROM task_events WHERE task_id = $1`, taskID).Scan(&n, &top))
	require.Equal(s.t, n, top, "the timeline of %s has a gap", taskID)
	require.NoError(s.t, s.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT runner_seq), coalesce(min(runner_seq), 0), coalesce(max(runner_seq), 0)
		FROM task_events WHERE task_id = $1 AND runner_seq IS NOT NULL`, taskID).Scan(&rn, &rdistinct, &rlo, &rhi))
	require.Equal(s.t, [4]int64{runnerEvents, runnerEvents, 1, runnerEvents}, [4]int64{rn, rdistinct, rlo, rhi},
		"runner events of %s: every one stored exactly once", taskID)
	return n
}

func (s *stack) task(id string) task.Task {
	tk, err := s.tasks.Get(context.Background(), id, "")
	require.NoError(s.t, err)
	return tk
}

// listAll reads a task's whole timeline through ListEvents (largest pages).
func listAll(t testing.TB, c taskrunnerv1.EventsServiceClient, ctx context.Context, id string) (seqs []int64, pages int) {
	req := &taskrunnerv1.ListEventsRequest{TaskId: id, PageSize: 1000}
	for {
		resp, err := c.ListEvents(ctx, req)
		require.NoError(t, err)
		pages++
		for _, e := range resp.GetEvents() {
			seqs = append(seqs, e.GetSeq())
		}
		if resp.GetNextPageToken() == "" {
			return seqs, pages
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

func seqRange(lo, hi int64) []int64 {
	var out []int64
	for i := lo; i <= hi; i++ {
		out = append(out, i)
	}
	return out
}

func logEvent(i int, size int) *taskrunnerv1.Event {
	line := fmt.Sprintf("line %05d ", i) + strings.Repeat("x", max(size-11, 0))
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: []string{line}}}}
}

func completed(pr string) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Completed{Completed: &taskrunnerv1.Completed{PrUrl: pr, PrNumber: 1}}}
}

var _ = pgx.ErrNoRows

// runnerBin is what the process provider starts as a runner: a script that
// records the start (task id and pid) in starts.txt and sleeps, so a test
// can count sandbox starts. The tests' runners are fake ones in the test.
func (s *stack) runnerBin() string {
	path := filepath.Join(s.dir, "runner.sh")
	script := "#!/bin/sh\necho \"$TASKRUNNER_TASK_ID $$\" >> " + s.startsFile() + "\nexec sleep 300\n"
	require.NoError(s.t, os.WriteFile(path, []byte(script), 0o755))
	s.t.Cleanup(func() {
		for _, pid := range s.starts() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return path
}

func (s *stack) startsFile() string { return filepath.Join(s.dir, "starts.txt") }

// starts maps each started sandbox's task id to its pid (and counts
// duplicates under "id#2"...).
func (s *stack) starts() map[string]int {
	b, _ := os.ReadFile(s.startsFile())
	out := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		pid, _ := strconv.Atoi(f[1])
		k := f[0]
		for n := 2; out[k] != 0; n++ {
			k = f[0] + "#" + strconv.Itoa(n)
		}
		out[k] = pid
	}
	return out
}

// taskClient is a bearer-token TaskService client of the public port.
func (s *stack) taskClient() (taskrunnerv1.TaskServiceClient, context.Context) {
	cc, err := grpc.NewClient("passthrough:///"+s.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(s.t, err)
	s.t.Cleanup(func() { _ = cc.Close() })
	return taskrunnerv1.NewTaskServiceClient(cc), metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+s.token)
}

// gateway starts the real REST/SSE gateway in front of taskrunnerd and
// returns its base URL once /healthz answers.
func (s *stack) gateway() string {
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(s.t))
	log, err := os.OpenFile(filepath.Join(s.dir, "gateway.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	require.NoError(s.t, err)
	cmd := exec.Command(filepath.Join(s.bin, "gateway"))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + s.dir, "TASKRUNNER_HTTP_ADDR=" + addr,
		"TASKRUNNER_TASK_ADDR=" + s.grpcAddr, "TASKRUNNER_EVENTS_ADDR=" + s.grpcAddr, "TASKRUNNER_REDIS_URL=" + s.rds.URL,
		"GOTRACEBACK=all"} // SIGQUIT dumps every goroutine (TestTwoThousandSSEConnectionsTwice counts them)
	cmd.Stdout, cmd.Stderr = log, log
	require.NoError(s.t, cmd.Start())
	s.gatewayPID = cmd.Process.Pid
	s.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = log.Close() })
	base := "http://" + addr
	require.Eventually(s.t, func() bool {
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 20*time.Millisecond, "the gateway never answered /healthz")
	return base
}

// get is an authenticated REST GET.
func (s *stack) get(url string) (*http.Response, []byte) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(s.t, err)
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}
