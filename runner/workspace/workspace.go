package workspace

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/taskrunner/taskrunner/runner/proc"
)

// Author is the commit author and committer.
const (
	AuthorName  = "taskrunner"
	AuthorEmail = "taskrunner@users.noreply.invalid"
)

// Config configures a Workspace.
type Config struct {
	// Dir is the checkout; it must exist, be empty and belong to User.
	Dir string
	// Git is the git binary (default "git").
	Git string
	// Env is the base environment (PATH, HOME, LANG); git isolation variables are added.
	Env []string
	// User runs git and openspec; nil keeps the runner's identity.
	User *proc.User
	// TaskID names the branch taskrunner/<TaskID>.
	TaskID string
	// BaseBranch is cloned for a task's first run.
	BaseBranch string
	// FollowUp clones the task branch taskrunner/<TaskID> (a follow-up run revising the task's
	// pull request) instead of BaseBranch; new commits go on top of it.
	FollowUp bool
}

// Workspace is one task's checkout.
type Workspace struct {
	cfg     Config
	baseSHA string
}

// New returns a Workspace; nothing happens until Clone.
func New(cfg Config) *Workspace {
	if cfg.Git == "" {
		cfg.Git = "git"
	}
	return &Workspace{cfg: cfg}
}

// User is who runs git and openspec (nil: the runner itself).
func (w *Workspace) User() *proc.User { return w.cfg.User }

// FollowUp tells whether this checkout is a follow-up run's (the task branch was cloned).
func (w *Workspace) FollowUp() bool { return w.cfg.FollowUp }

// BranchChanges lists the OpenSpec change directories (openspec/changes/<name> or
// openspec/changes/archive/<dated-name>) the task branch added or changed compared with the
// base branch: the change so far, for a follow-up.
func (w *Workspace) BranchChanges(ctx context.Context) ([]string, error) {
	out, err := w.git(ctx, "diff", "", "diff", "--name-only", "--no-renames", "origin/"+w.cfg.BaseBranch+"...HEAD", "--", "openspec/changes/")
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var dirs []string
	for _, p := range strings.Split(out, "\n") {
		parts := strings.Split(p, "/")
		n := 3 // openspec/changes/<name>/…
		if len(parts) > 3 && parts[2] == "archive" {
			n = 4
		}
		if len(parts) <= n {
			continue
		}
		d := strings.Join(parts[:n], "/")
		if !seen[d] {
			seen[d] = true
			dirs = append(dirs, d)
		}
	}
	return dirs, nil
}

// Dir is the checkout directory.
func (w *Workspace) Dir() string { return w.cfg.Dir }

// Branch is the task branch.
func (w *Workspace) Branch() string { return "taskrunner/" + w.cfg.TaskID }

// BaseSHA is the commit this run started from (after Clone): the base branch's head for a
// first run, the task branch's head for a follow-up.
func (w *Workspace) BaseSHA() string { return w.baseSHA }

// Cloned is true once Clone succeeded.
func (w *Workspace) Cloned() bool { return w.baseSHA != "" }

// Kind classifies git failures the control plane must tell apart.
type Kind int

const (
	// KindOther is any other failure.
	KindOther Kind = iota
	// KindAuth: the forge refused the token.
	KindAuth
	// KindRepoNotFound: the repository does not exist (or the token cannot see it).
	KindRepoNotFound
	// KindBranchNotFound: the branch to clone (base, or the task branch of a follow-up) does not exist.
	KindBranchNotFound
)

// Error is a failed git command. Output is git's stderr, which never holds the token (it is
// not in argv or the URL), but callers still redact it.
type Error struct {
	Op     string
	Kind   Kind
	Output string
	Err    error
}

func (e *Error) Error() string {
	switch e.Kind {
	case KindAuth:
		return fmt.Sprintf("git %s: authentication failed: the forge refused the repository token", e.Op)
	case KindRepoNotFound:
		return fmt.Sprintf("git %s: repository not found", e.Op)
	case KindBranchNotFound:
		return fmt.Sprintf("git %s: branch not found", e.Op)
	}
	return fmt.Sprintf("git %s: %v: %s", e.Op, e.Err, lastLines(e.Output, 3))
}

func (e *Error) Unwrap() error { return e.Err }

func classify(out string) Kind {
	l := strings.ToLower(out)
	switch {
	case strings.Contains(l, "could not read username"), strings.Contains(l, "authentication failed"),
		strings.Contains(l, "error: 401"), strings.Contains(l, "error: 403"), strings.Contains(l, "403 forbidden"):
		return KindAuth
	case strings.Contains(l, "remote branch") && strings.Contains(l, "not found"):
		return KindBranchNotFound
	case strings.Contains(l, "repository") && strings.Contains(l, "not found"), strings.Contains(l, "error: 404"):
		return KindRepoNotFound
	}
	return KindOther
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// authEnv passes the token as an extra HTTP header through git's environment configuration.
func authEnv(token string) []string {
	if token == "" {
		return nil
	}
	basic := base64.StdEncoding.EncodeToString([]byte("x-access-token:" + token))
	return []string{
		"GIT_CONFIG_COUNT=1",
		"GIT_CONFIG_KEY_0=http.extraHeader",
		"GIT_CONFIG_VALUE_0=Authorization: Basic " + basic,
	}
}

func (w *Workspace) env(extra []string) []string {
	env := append([]string(nil), w.cfg.Env...)
	env = append(env,
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL="+os.DevNull, "GIT_TERMINAL_PROMPT=0",
		"GIT_ASKPASS=", "SSH_ASKPASS=", "LC_ALL=C",
		"GIT_AUTHOR_NAME="+AuthorName, "GIT_AUTHOR_EMAIL="+AuthorEmail,
		"GIT_COMMITTER_NAME="+AuthorName, "GIT_COMMITTER_EMAIL="+AuthorEmail,
	)
	return append(env, extra...)
}

// git runs git in the checkout. Hooks are always disabled.
func (w *Workspace) git(ctx context.Context, op string, token string, args ...string) (string, error) {
	full := append([]string{"-c", "core.hooksPath=" + os.DevNull, "-c", "credential.helper="}, args...)
	cmd := proc.Command(ctx, w.cfg.User, w.cfg.Dir, w.env(authEnv(token)), w.cfg.Git, full...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return "", context.Cause(ctx)
		}
		out := stderr.String()
		return stdout.String(), &Error{Op: op, Kind: classify(out), Output: out, Err: err}
	}
	return stdout.String(), nil
}

// Clone clones the base branch of remote into the checkout and creates the task branch; for
// a follow-up it clones the task branch itself.
func (w *Workspace) Clone(ctx context.Context, remote, token string) (err error) {
	branch := w.cfg.BaseBranch
	if w.cfg.FollowUp {
		branch = w.Branch()
	}
	ctx, span := tracer.Start(ctx, "git.clone", trace.WithAttributes(attribute.String("taskrunner.base_branch", w.cfg.BaseBranch),
		attribute.String("taskrunner.cloned_branch", branch)))
	defer func() { endSpan(span, err) }()
	if _, err := w.git(ctx, "clone", token, "clone", "--quiet", "--no-tags", "--branch", branch, "--", remote, "."); err != nil {
		return err
	}
	if !w.cfg.FollowUp {
		if _, err := w.git(ctx, "checkout", "", "checkout", "--quiet", "-b", w.Branch()); err != nil {
			return err
		}
	}
	sha, err := w.git(ctx, "rev-parse", "", "rev-parse", "HEAD")
	if err != nil {
		return err
	}
	w.baseSHA = strings.TrimSpace(sha)
	return nil
}

// HasOpenSpec tells whether the checkout has an openspec/ directory.
func (w *Workspace) HasOpenSpec() bool {
	st, err := os.Stat(filepath.Join(w.cfg.Dir, "openspec"))
	return err == nil && st.IsDir()
}

// InitOpenSpec runs `openspec init --tools <tool> .` in the checkout.
func (w *Workspace) InitOpenSpec(ctx context.Context, bin, tool string) error {
	env := append(append([]string(nil), w.cfg.Env...), "OPENSPEC_TELEMETRY=0", "DO_NOT_TRACK=1", "CI=1")
	cmd := proc.Command(ctx, w.cfg.User, w.cfg.Dir, env, bin, "init", "--tools", tool, ".")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return fmt.Errorf("openspec init: %w: %s", err, lastLines(out.String(), 3))
	}
	if !w.HasOpenSpec() {
		return errors.New("openspec init: no openspec/ directory was created")
	}
	return nil
}

// agentDirs are where the agent CLIs and `openspec init --tools <agent>` keep their own files
// (commands, skills, settings). Untracked files there never enter the pull request.
var agentDirs = []string{".claude/", ".codex/", ".agents/"}

// ExcludeScaffolding keeps the runner's and the agent tooling's own files out of every commit:
// the agent directories and every file that is untracked right now (call it after `openspec
// init`, before the agent runs: those are what init added), except the OpenSpec changes and
// specs, which are the record of the change. They are listed in .git/info/exclude, so `git add
// -A` skips them while files the repository already tracks (even under .claude/) still are
// committed when they change. It returns the paths it excluded besides the agent directories.
func (w *Workspace) ExcludeScaffolding(ctx context.Context) ([]string, error) {
	out, err := w.git(ctx, "ls-files", "", "ls-files", "-z", "--others", "--exclude-standard")
	if err != nil {
		return nil, err
	}
	var added []string
	for _, p := range strings.Split(out, "\x00") {
		if p == "" || strings.HasPrefix(p, "openspec/changes/") || strings.HasPrefix(p, "openspec/specs/") {
			continue
		}
		skip := false
		for _, d := range agentDirs {
			skip = skip || strings.HasPrefix(p, d)
		}
		if !skip {
			added = append(added, p)
		}
	}
	var b strings.Builder
	b.WriteString("\n# taskrunner: the agent tooling's own files, never part of the pull request\n")
	for _, d := range agentDirs {
		b.WriteString("/" + d + "\n")
	}
	for _, p := range added {
		b.WriteString("/" + excludeEscape(p) + "\n")
	}
	f, err := os.OpenFile(filepath.Join(w.cfg.Dir, ".git", "info", "exclude"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("exclude scaffolding: %w", err)
	}
	if _, err := f.WriteString(b.String()); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("exclude scaffolding: %w", err)
	}
	return added, f.Close()
}

// excludeEscape makes a path a literal gitignore pattern.
func excludeEscape(p string) string {
	var b strings.Builder
	for i, r := range p {
		if strings.ContainsRune(`\*?[`, r) || (i == 0 && (r == '#' || r == '!')) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	s := b.String()
	if strings.HasSuffix(s, " ") {
		s = strings.TrimSuffix(s, " ") + "\\ "
	}
	return s
}

// Stats are diff stats against the base commit.
type Stats struct {
	Additions, Deletions, FilesChanged int64
}

// DiffStats stages everything (git add -A) and counts the staged diff against the base commit,
// exactly `git diff --cached --numstat <base>`. Binary files count as changed files without
// lines.
func (w *Workspace) DiffStats(ctx context.Context) (Stats, error) {
	if _, err := w.git(ctx, "add", "", "add", "-A"); err != nil {
		return Stats{}, err
	}
	out, err := w.git(ctx, "diff", "", "diff", "--cached", "--numstat", w.baseSHA)
	if err != nil {
		return Stats{}, err
	}
	return ParseNumstat(out), nil
}

// FileStat is one file of a diff; Binary files have no line counts.
type FileStat struct {
	Path                 string
	Additions, Deletions int64
	Binary               bool
}

// CommittedDiff is `git diff --numstat <BaseSHA> HEAD` file by file: what this run committed.
func (w *Workspace) CommittedDiff(ctx context.Context) ([]FileStat, error) {
	out, err := w.git(ctx, "diff", "", "diff", "--numstat", w.baseSHA, "HEAD")
	if err != nil {
		return nil, err
	}
	return ParseNumstatFiles(out), nil
}

// NewCommits are the short ids of this run's commits (BaseSHA..HEAD), oldest first.
func (w *Workspace) NewCommits(ctx context.Context) ([]string, error) {
	out, err := w.git(ctx, "rev-list", "", "rev-list", "--reverse", "--abbrev-commit", w.baseSHA+"..HEAD")
	if err != nil {
		return nil, err
	}
	return strings.Fields(out), nil
}

// HeadSHA is the commit checked out.
func (w *Workspace) HeadSHA(ctx context.Context) (string, error) {
	out, err := w.git(ctx, "rev-parse", "", "rev-parse", "HEAD")
	return strings.TrimSpace(out), err
}

// ParseNumstatFiles reads `git diff --numstat` output file by file.
func ParseNumstatFiles(out string) []FileStat {
	var files []FileStat
	for _, line := range strings.Split(out, "\n") {
		f := strings.SplitN(line, "\t", 3)
		if len(f) < 3 {
			continue
		}
		fs := FileStat{Path: f[2], Binary: f[0] == "-"}
		fs.Additions, _ = strconv.ParseInt(f[0], 10, 64)
		fs.Deletions, _ = strconv.ParseInt(f[1], 10, 64)
		files = append(files, fs)
	}
	return files
}

// ParseNumstat sums `git diff --numstat` output.
func ParseNumstat(out string) Stats {
	var s Stats
	for _, line := range strings.Split(out, "\n") {
		f := strings.SplitN(line, "\t", 3)
		if len(f) < 3 {
			continue
		}
		s.FilesChanged++
		if a, err := strconv.ParseInt(f[0], 10, 64); err == nil {
			s.Additions += a
		}
		if d, err := strconv.ParseInt(f[1], 10, 64); err == nil {
			s.Deletions += d
		}
	}
	return s
}

// cleanConfig replaces .git/config before a push: the agent could have added url.insteadOf
// rewrites, proxies or helpers that would send the token elsewhere.
const cleanConfig = `[core]
	repositoryformatversion = 0
	filemode = true
	bare = false
	logallrefupdates = true
`

// Commit stages everything and commits it with message. It reports false when there is
// nothing to commit.
func (w *Workspace) Commit(ctx context.Context, message string) (bool, error) {
	if err := os.WriteFile(filepath.Join(w.cfg.Dir, ".git", "config"), []byte(cleanConfig), 0o644); err != nil {
		return false, fmt.Errorf("reset git config: %w", err)
	}
	if _, err := w.git(ctx, "add", "", "add", "-A"); err != nil {
		return false, err
	}
	out, err := w.git(ctx, "status", "", "status", "--porcelain")
	if err != nil {
		return false, err
	}
	if strings.TrimSpace(out) == "" {
		return false, nil
	}
	if _, err := w.git(ctx, "commit", "", "commit", "--quiet", "--no-verify", "-m", message); err != nil {
		return false, err
	}
	return true, nil
}

// Ahead tells whether the task branch has commits the base does not have.
func (w *Workspace) Ahead(ctx context.Context) (bool, error) {
	out, err := w.git(ctx, "rev-list", "", "rev-list", "--count", w.baseSHA+"..HEAD")
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(out) != "0", nil
}

// Push pushes HEAD to the task branch of remote.
func (w *Workspace) Push(ctx context.Context, remote, token string) (err error) {
	ctx, span := tracer.Start(ctx, "git.push", trace.WithAttributes(attribute.String("taskrunner.head_branch", w.Branch())))
	defer func() { endSpan(span, err) }()
	if err := os.WriteFile(filepath.Join(w.cfg.Dir, ".git", "config"), []byte(cleanConfig), 0o644); err != nil {
		return fmt.Errorf("reset git config: %w", err)
	}
	_, err = w.git(ctx, "push", token, "push", "--quiet", "--no-verify", "--", remote, "HEAD:refs/heads/"+w.Branch())
	return err
}

var changeNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)

// Changes lists the active OpenSpec changes (directories under openspec/changes/ except
// archive), most recently modified first.
func (w *Workspace) Changes() []string {
	root := filepath.Join(w.cfg.Dir, "openspec", "changes")
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	type ch struct {
		name string
		mod  int64
	}
	var out []ch
	for _, e := range entries {
		if !e.IsDir() || e.Name() == "archive" || !changeNameRE.MatchString(e.Name()) {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		out = append(out, ch{e.Name(), info.ModTime().UnixNano()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].mod > out[j].mod })
	names := make([]string, len(out))
	for i, c := range out {
		names[i] = c.name
	}
	return names
}

// ChangeDir finds a change, active (openspec/changes/<name>) or archived
// (openspec/changes/archive/<date>-<name>). It returns "" when there is none.
func (w *Workspace) ChangeDir(name string) string {
	active := filepath.Join(w.cfg.Dir, "openspec", "changes", name)
	if st, err := os.Stat(active); err == nil && st.IsDir() {
		return active
	}
	matches, _ := filepath.Glob(filepath.Join(w.cfg.Dir, "openspec", "changes", "archive", "*-"+name))
	sort.Strings(matches)
	if len(matches) > 0 {
		return matches[len(matches)-1]
	}
	return ""
}

// Archived tells whether the change was moved under openspec/changes/archive/.
func (w *Workspace) Archived(name string) bool {
	d := w.ChangeDir(name)
	return d != "" && strings.Contains(filepath.ToSlash(d), "/openspec/changes/archive/")
}

var tracer = otel.Tracer("github.com/taskrunner/taskrunner/runner/workspace")

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
