package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/taskrunner/taskrunner/services/sandbox"
)

// UnisolatedEnv is the escape hatch that lets the provider run tasks as
// plain processes when bubblewrap is missing. New reads it itself (as well
// as Config.Unisolated) so that no caller can lose it on the way.
const UnisolatedEnv = "TASKRUNNER_PROCESS_UNISOLATED"

// Config configures the provider.
type Config struct {
	// RunnerBin is the runner binary to start.
	RunnerBin string
	// WorkRoot holds one directory per sandbox.
	WorkRoot string
	// Bwrap is "auto" or "" (bubblewrap, refusing to start without it
	// unless Unisolated), "always" (bubblewrap, never unisolated) or
	// "never" (plain processes: an explicit choice for tests whose fake
	// runner writes outside its workspace).
	Bwrap string
	// Unisolated allows plain processes when bubblewrap does not work
	// here; TASKRUNNER_PROCESS_UNISOLATED=1 in the environment does too.
	Unisolated bool `env:"TASKRUNNER_PROCESS_UNISOLATED"`
	// KillGrace is how long Destroy waits after SIGTERM before SIGKILL.
	KillGrace time.Duration
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.RunnerBin == "" {
		return errors.New("process provider: runner binary is not set (TASKRUNNER_PROCESS_RUNNER_BIN)")
	}
	if fi, err := os.Stat(c.RunnerBin); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("process provider: runner binary %q is not an executable file (TASKRUNNER_PROCESS_RUNNER_BIN)", c.RunnerBin)
	}
	if c.WorkRoot == "" {
		return errors.New("process provider: work root is not set (TASKRUNNER_PROCESS_WORK_ROOT)")
	}
	switch c.Bwrap {
	case "", "auto", "always", "never":
	default:
		return fmt.Errorf("process provider: TASKRUNNER_PROCESS_BWRAP must be auto, always or never, got %q", c.Bwrap)
	}
	return nil
}

// Provider runs sandboxes as local processes.
type Provider struct {
	cfg   Config
	bwrap string // path, or "" when not used
	log   *slog.Logger
	mu    sync.Mutex // serialises Create per provider (idempotency check + start)
}

var _ sandbox.Provider = (*Provider)(nil)

// New validates cfg and probes bubblewrap: without a working bwrap it
// refuses to start unless unisolated processes were asked for explicitly.
func New(cfg Config, log *slog.Logger) (*Provider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.KillGrace <= 0 {
		cfg.KillGrace = 10 * time.Second
	}
	if os.Getenv(UnisolatedEnv) == "1" {
		cfg.Unisolated = true
	}
	abs, err := filepath.Abs(cfg.WorkRoot)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("process provider: work root: %w", err)
	}
	// Mount targets must be real paths: bwrap does not follow a symlink
	// in a destination the way the kernel does for the caller.
	if cfg.WorkRoot, err = filepath.EvalSymlinks(abs); err != nil {
		return nil, fmt.Errorf("process provider: work root: %w", err)
	}
	if bin, err := filepath.Abs(cfg.RunnerBin); err == nil {
		cfg.RunnerBin = bin
	}
	p := &Provider{cfg: cfg, log: log}
	if cfg.Bwrap == "never" {
		log.Warn("TASKRUNNER_PROCESS_BWRAP=never: tasks run as plain processes and can read and write each other's workspaces")
		return p, nil
	}
	path, err := exec.LookPath("bwrap")
	if err == nil {
		err = p.probe(path)
	}
	switch {
	case err == nil:
		p.bwrap = path
	case cfg.Bwrap == "always" || !cfg.Unisolated:
		return nil, fmt.Errorf("process provider: bubblewrap (bwrap) does not work here (%v); without it a task could read and write "+
			"other tasks' workspaces. Install it (apt-get install bubblewrap, or `make bubblewrap`), or set %s=1 to run tasks "+
			"unisolated anyway", err, UnisolatedEnv)
	default:
		log.Warn("bubblewrap not available and "+UnisolatedEnv+"=1: tasks run as plain processes", "error", err)
	}
	return p, nil
}

// probe runs true(1) in a sandbox made the way Create makes one.
func (p *Provider) probe(bwrap string) error {
	dir, err := os.MkdirTemp(p.cfg.WorkRoot, ".probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	out, err := exec.Command(bwrap, p.bwrapArgs(dir, []string{"true"})...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Name implements sandbox.Provider.
func (p *Provider) Name() string { return "process" }

// Isolated reports whether sandboxes run inside bubblewrap.
func (p *Provider) Isolated() bool { return p.bwrap != "" }

// runnerCaps are what a runner started as root keeps inside bubblewrap: it
// prepares the workspace for the agent's user (chown), switches to that
// user (setuid/setgid), works in the agent's files and stops the agent.
// CAP_SYS_ADMIN is not among them, so nothing inside can undo the mounts.
var runnerCaps = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID"}

// bwrapArgs builds the sandbox of one task: the host read-only (the
// runner binary, git, node and the agent CLIs are reachable), a private
// /tmp (mode 1777), /dev and /proc, the work root replaced by an empty read-only tmpfs
// so other tasks' directories do not exist inside, and only the task's own
// workspace mounted back writable. PID, IPC and UTS namespaces are
// private; the network is kept (the runner dials the control plane).
func (p *Provider) bwrapArgs(work string, argv []string, path ...string) []string {
	args := []string{
		"--ro-bind", "/", "/",
		"--dev", "/dev",
		"--proc", "/proc",
		// World-writable and sticky, as on the host: the agent runs as an
		// unprivileged user and writes there (Claude Code: /tmp/claude-<uid>).
		"--perms", "1777", "--tmpfs", "/tmp",
		"--perms", "1777", "--tmpfs", "/var/tmp",
		"--tmpfs", p.cfg.WorkRoot,
		"--dir", work,
		"--remount-ro", p.cfg.WorkRoot,
		"--bind", work, work,
	}
	// The runner (and an explicit command) may live under a path hidden
	// above, as in tests, and so may the agent CLIs on the sandbox's PATH
	// (a checkout under /tmp: node_modules/.bin links into node_modules,
	// which goes back whole): mount them back read-only.
	var binds []string
	bins := []string{p.cfg.RunnerBin}
	if filepath.IsAbs(argv[0]) {
		bins = append(bins, argv[0])
	}
	for _, b := range bins {
		if b, err := filepath.EvalSymlinks(b); err == nil {
			binds = append(binds, b)
		}
	}
	binds = append(binds, hiddenPathDirs(path)...)
	// bwrap makes the missing parents of a bind 0700: the unprivileged
	// agent could not reach what is below. Make them 0755 first.
	made := map[string]bool{}
	for _, b := range binds {
		for _, parent := range parentsBelowTmp(b) {
			if !made[parent] {
				made[parent] = true
				args = append(args, "--perms", "0755", "--dir", parent)
			}
		}
	}
	for _, b := range binds {
		args = append(args, "--ro-bind", b, b)
	}
	if os.Geteuid() == 0 {
		args = append(args, "--cap-drop", "ALL")
		for _, c := range runnerCaps {
			args = append(args, "--cap-add", c)
		}
	}
	// No --new-session: Create already starts bwrap in a session of its
	// own without a controlling terminal (so TIOCSTI has no target), and
	// staying in that session is what lets Destroy find every process of
	// the sandbox even after bwrap itself died.
	args = append(args, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--chdir", work, "--")
	return append(args, argv...)
}

// state is what a sandbox's state.json holds.
type state struct {
	ID        string            `json:"id"`
	PID       int               `json:"pid"`
	StartTick uint64            `json:"start_tick"` // /proc/<pid>/stat starttime, against pid reuse
	Labels    map[string]string `json:"labels"`
	CreatedAt time.Time         `json:"created_at"`
	Deadline  time.Time         `json:"deadline"`
	ExitCode  *int              `json:"exit_code,omitempty"`
	Isolated  bool              `json:"isolated"`
}

func (p *Provider) dir(id string) string       { return filepath.Join(p.cfg.WorkRoot, id) }
func (p *Provider) statePath(id string) string { return filepath.Join(p.dir(id), "state.json") }

func (p *Provider) readState(id string) (*state, error) {
	if !validID(id) {
		return nil, fmt.Errorf("%w: %q", sandbox.ErrNotFound, id)
	}
	b, err := os.ReadFile(p.statePath(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", sandbox.ErrNotFound, id)
	}
	if err != nil {
		return nil, err
	}
	var s state
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("sandbox %s: corrupt state: %w", id, err)
	}
	return &s, nil
}

func (p *Provider) writeState(s *state) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := p.statePath(s.ID) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p.statePath(s.ID))
}

// startTick reads the process start time so a reused pid is not mistaken
// for our process.
func startTick(pid int) (uint64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 20 {
		return 0, false
	}
	if fields[0] == "Z" { // zombie: exited, not yet reaped
		return 0, false
	}
	v, err := strconv.ParseUint(fields[19], 10, 64)
	return v, err == nil
}

func (s *state) alive() bool {
	t, ok := startTick(s.PID)
	return ok && t == s.StartTick
}

func (p *Provider) toSandbox(s *state) sandbox.Sandbox {
	st := sandbox.StateExited
	if s.alive() {
		st = sandbox.StateRunning
	}
	return sandbox.Sandbox{ID: s.ID, Provider: p.Name(), State: st, Labels: s.Labels, CreatedAt: s.CreatedAt, ExitCode: s.ExitCode}
}

// Create implements sandbox.Provider. The sandbox id is derived from the
// task id, so a second Create for the same task returns the first sandbox.
func (p *Provider) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if spec.TaskID == "" {
		return sandbox.Sandbox{}, fmt.Errorf("%w: no task id", sandbox.ErrInvalidSpec)
	}
	id := sandbox.Name(spec.TaskID)
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, err := p.readState(id); err == nil {
		return p.toSandbox(s), nil
	}
	dir := p.dir(id)
	work := filepath.Join(dir, "work")
	// A Dispatch killed between starting the runner and recording it left a
	// live sandbox without a state file: adopt it rather than start a
	// second runner for the task.
	if pid, ok := sessionIn(work); ok {
		tick, _ := startTick(pid)
		s := &state{ID: id, PID: pid, StartTick: tick, Labels: spec.AllLabels(), CreatedAt: time.Now().UTC(),
			Deadline: spec.Deadline, Isolated: p.bwrap != ""}
		if err := p.writeState(s); err != nil {
			return sandbox.Sandbox{}, err
		}
		p.log.Info("sandbox adopted", "sandbox_id", id, "task_id", spec.TaskID, "pid", pid)
		return p.toSandbox(s), nil
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return sandbox.Sandbox{}, err
	}
	argv := spec.Command
	if len(argv) == 0 {
		argv = []string{p.cfg.RunnerBin}
	}
	// coreutils timeout enforces the deadline even if Dispatch restarts.
	if !spec.Deadline.IsZero() {
		secs := int(time.Until(spec.Deadline).Seconds())
		if secs < 1 {
			return sandbox.Sandbox{}, fmt.Errorf("%w: deadline already passed", sandbox.ErrInvalidSpec)
		}
		argv = append([]string{"timeout", "--signal=TERM", "--kill-after=" + strconv.Itoa(int(p.cfg.KillGrace.Seconds())+1) + "s", strconv.Itoa(secs) + "s"}, argv...)
	}
	name := argv[0]
	args := argv[1:]
	if p.bwrap != "" {
		path := spec.Env["PATH"]
		if path == "" {
			path = os.Getenv("PATH") // what envList gives the runner
		}
		name, args = p.bwrap, p.bwrapArgs(work, argv, filepath.SplitList(path)...)
	}
	logf, err := os.OpenFile(filepath.Join(dir, "runner.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	cmd := exec.Command(name, args...)
	cmd.Dir = work
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = envList(spec.Env, work)
	// Own session and process group: survives Dispatch restarts, and Destroy
	// can signal the whole tree.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return sandbox.Sandbox{}, fmt.Errorf("start runner: %w", err)
	}
	_ = logf.Close()
	tick, _ := startTick(cmd.Process.Pid)
	s := &state{ID: id, PID: cmd.Process.Pid, StartTick: tick, Labels: spec.AllLabels(), CreatedAt: time.Now().UTC(),
		Deadline: spec.Deadline, Isolated: p.bwrap != ""}
	if err := p.writeState(s); err != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_, _ = cmd.Process.Wait()
		return sandbox.Sandbox{}, err
	}
	go p.reap(cmd, id)
	p.log.Info("sandbox started", "sandbox_id", id, "task_id", spec.TaskID, "pid", s.PID, "bwrap", s.Isolated)
	return p.toSandbox(s), nil
}

// reap waits for our child and records its exit code.
func (p *Provider) reap(cmd *exec.Cmd, id string) {
	err := cmd.Wait()
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else {
			code = -1
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, err := p.readState(id); err == nil {
		s.ExitCode = &code
		_ = p.writeState(s)
	}
	p.log.Info("sandbox exited", "sandbox_id", id, "exit_code", code)
}

func envList(env map[string]string, work string) []string {
	out := []string{"PATH=" + os.Getenv("PATH"), "TASKRUNNER_WORKDIR=" + work}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out = append(out, k+"="+env[k])
	}
	return out
}

// Get implements sandbox.Provider.
func (p *Provider) Get(_ context.Context, id string) (sandbox.Sandbox, error) {
	s, err := p.readState(id)
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	return p.toSandbox(s), nil
}

// List implements sandbox.Provider.
func (p *Provider) List(_ context.Context, labels map[string]string) ([]sandbox.Sandbox, error) {
	entries, err := os.ReadDir(p.cfg.WorkRoot)
	if err != nil {
		return nil, err
	}
	var out []sandbox.Sandbox
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		s, err := p.readState(e.Name())
		if err != nil {
			continue
		}
		match := true
		for k, v := range labels {
			if s.Labels[k] != v {
				match = false
				break
			}
		}
		if match {
			out = append(out, p.toSandbox(s))
		}
	}
	return out, nil
}

// Destroy implements sandbox.Provider: SIGTERM to the process tree,
// SIGKILL after the grace period, then everything the task left on this
// host is removed: its directory (workspace, state, runner log) and the
// <id>.log that earlier versions kept beside it.
func (p *Provider) Destroy(ctx context.Context, id string) error {
	if !validID(id) {
		return nil // cannot name a sandbox directory, so there is none
	}
	s, err := p.readState(id)
	switch {
	case errors.Is(err, sandbox.ErrNotFound):
		return p.removeFiles(id) // a Create that died before its state file
	case err != nil:
		return err
	}
	// Collect the whole tree before signalling: once the leader dies its
	// children are re-parented and the ancestry is lost.
	victims := sessionTree(s.PID)
	if s.alive() {
		signalAll(victims, syscall.SIGTERM)
		// Poll until the tree is gone or the grace period ends (a
		// cancelled ctx ends it early): the kill below follows anyway.
		// bubblewrap's own processes are not waited for: its init in the
		// PID namespace ignores SIGTERM and exits once the runner has.
		workers := p.notBwrap(victims)
		_, _ = backoff.Retry(ctx, func() (struct{}, error) {
			if anyAlive(workers) {
				return struct{}{}, errStillAlive
			}
			return struct{}{}, nil
		}, backoff.WithBackOff(backoff.NewConstantBackOff(50*time.Millisecond)), backoff.WithMaxElapsedTime(p.cfg.KillGrace))
	}
	// Whatever is left (agents in their own process groups or sessions
	// included) is killed, again until nothing of the session is left: a
	// sandbox destroyed while it starts may still be forking.
	signalAll(victims, syscall.SIGKILL)
	_, _ = backoff.Retry(context.WithoutCancel(ctx), func() (struct{}, error) {
		left := sessionTree(s.PID)
		if len(left) == 0 {
			return struct{}{}, nil
		}
		signalAll(left, syscall.SIGKILL)
		return struct{}{}, errStillAlive
	}, backoff.WithBackOff(backoff.NewConstantBackOff(20*time.Millisecond)), backoff.WithMaxElapsedTime(5*time.Second))
	if err := p.removeFiles(id); err != nil {
		return err
	}
	p.log.Info("sandbox destroyed", "sandbox_id", id)
	return nil
}

var errStillAlive = errors.New("sandbox processes still alive")

// notBwrap leaves out the bubblewrap processes of procs.
func (p *Provider) notBwrap(procs []procRef) []procRef {
	if p.bwrap == "" {
		return procs
	}
	bw, _ := filepath.EvalSymlinks(p.bwrap)
	out := procs[:0:0]
	for _, pr := range procs {
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pr.pid)); err != nil || exe != bw {
			out = append(out, pr)
		}
	}
	return out
}

// validID accepts what sandbox.Name produces, so Destroy never removes a
// path outside the work root.
func validID(id string) bool {
	return id != "" && id != "." && id != ".." && !strings.ContainsAny(id, "/\\") && !strings.HasPrefix(id, ".")
}

// removeFiles deletes the task's directory and log.
func (p *Provider) removeFiles(id string) error {
	if err := os.RemoveAll(p.dir(id)); err != nil {
		return fmt.Errorf("remove sandbox %s: %w", id, err)
	}
	if err := os.Remove(filepath.Join(p.cfg.WorkRoot, id+".log")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove sandbox %s: %w", id, err)
	}
	return nil
}

type procRef struct {
	pid  int
	tick uint64
}

// sessionTree lists the processes of the session sid (the sandbox leader
// started it with setsid) and every descendant of sid, with their start
// times so a reused pid is never signalled.
func sessionTree(sid int) []procRef {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	parent := map[int]int{}
	inSession := map[int]bool{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		st := string(b)
		i := strings.LastIndexByte(st, ')')
		if i < 0 {
			continue
		}
		// fields after ")": state ppid pgrp session …
		f := strings.Fields(st[i+1:])
		if len(f) < 4 {
			continue
		}
		parent[pid], _ = strconv.Atoi(f[1])
		inSession[pid] = f[3] == strconv.Itoa(sid)
	}
	var out []procRef
	for pid := range parent {
		match := inSession[pid] || pid == sid
		for p, hops := parent[pid], 0; !match && p > 1 && hops < 64; p, hops = parent[p], hops+1 {
			match = p == sid
		}
		if match {
			if t, ok := startTick(pid); ok {
				out = append(out, procRef{pid, t})
			}
		}
	}
	return out
}

func signalAll(procs []procRef, sig syscall.Signal) {
	for _, p := range procs {
		if t, ok := startTick(p.pid); ok && t == p.tick {
			_ = syscall.Kill(p.pid, sig)
		}
	}
}

func anyAlive(procs []procRef) bool {
	for _, p := range procs {
		if t, ok := startTick(p.pid); ok && t == p.tick {
			return true
		}
	}
	return false
}

// sessionIn finds a live process that leads its own session with work as
// its working directory: a runner this provider started (Setsid, Dir =
// work) whose state file was never written.
func sessionIn(work string) (int, bool) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if err != nil || cwd != work {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		// After the command: state, ppid, pgrp, session.
		if len(f) > 3 && f[3] == e.Name() && f[0] != "Z" {
			return pid, true
		}
	}
	return 0, false
}

// hiddenPathDirs are the directories of path that the sandbox's private
// /tmp and /var/tmp would hide, to mount back read-only: a node_modules/.bin
// entry brings back its node_modules, whose packages its links point into.
func hiddenPathDirs(path []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, d := range path {
		if !filepath.IsAbs(d) {
			continue
		}
		d = filepath.Clean(d)
		if !strings.HasPrefix(d, "/tmp/") && !strings.HasPrefix(d, "/var/tmp/") {
			continue
		}
		if filepath.Base(d) == ".bin" && filepath.Base(filepath.Dir(d)) == "node_modules" {
			d = filepath.Dir(d)
		}
		real, err := filepath.EvalSymlinks(d)
		if err != nil || seen[real] {
			continue
		}
		if fi, err := os.Stat(real); err != nil || !fi.IsDir() {
			continue
		}
		seen[real] = true
		out = append(out, real)
	}
	return out
}

// parentsBelowTmp lists dir's ancestors below /tmp or /var/tmp, outermost
// first (for /tmp/a/b/c: /tmp/a, /tmp/a/b).
func parentsBelowTmp(dir string) []string {
	if !strings.HasPrefix(dir, "/tmp/") && !strings.HasPrefix(dir, "/var/tmp/") {
		return nil
	}
	var out []string
	for d := filepath.Dir(dir); d != "/tmp" && d != "/var/tmp" && d != "/" && d != "."; d = filepath.Dir(d) {
		out = append([]string{d}, out...)
	}
	return out
}
