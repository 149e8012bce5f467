package forge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// ErrRepoExists is returned by CreateRepo when the repository already exists.
var ErrRepoExists = errors.New("forge: repository already exists")

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

type owner struct {
	login          string
	id             int64
	installationID int64
	createdAt      time.Time
}

type repo struct {
	id            int64
	owner         *owner
	name          string
	defaultBranch string
	dir           string
	createdAt     time.Time
	pulls         []*PullRequest
	// reviews, reviewComments and issueComments are in creation order (ids ascending).
	reviews        []*Review
	reviewComments []*ReviewComment
	issueComments  []*IssueComment
	// collaborators maps a lower-case login to its role: admin, maintain, write, triage, read.
	collaborators map[string]string
}

func (r *repo) fullName() string { return r.owner.login + "/" + r.name }

// PullRequest is the forge's record of a pull request.
type PullRequest struct {
	Repo           string // "owner/name"
	ID             int64
	Number         int
	Title          string
	Body           string
	Head           string // branch name, without "owner:"
	Base           string
	HeadSHA        string // live while open, frozen when closed
	BaseSHA        string
	State          string // "open" or "closed"
	Draft          bool
	Merged         bool
	MergeCommitSHA string
	User           string
	MergedBy       string // login; empty unless merged
	Comments       int    // issue comments
	ReviewComments int
	CreatedAt      time.Time
	UpdatedAt      time.Time
	ClosedAt       time.Time // zero while open
	MergedAt       time.Time // zero unless merged
}

// Review is the forge's record of a submitted pull request review.
type Review struct {
	ID                int64
	Number            int    // the pull request
	User              string // login
	Body              string
	State             string // APPROVED, CHANGES_REQUESTED or COMMENTED
	CommitID          string
	AuthorAssociation string
	SubmittedAt       time.Time
}

// ReviewComment is a comment on a line of a pull request's diff. Like GitHub, the forge files
// every review comment under a review, even one created on its own.
type ReviewComment struct {
	ID                int64
	ReviewID          int64
	Number            int
	User              string
	Body              string
	Path              string
	Line              int
	Side              string // RIGHT (the head) or LEFT (the base)
	CommitID          string
	InReplyTo         int64 // 0 unless a reply
	AuthorAssociation string
	CreatedAt         time.Time
}

// IssueComment is a comment on a pull request's conversation (the issues API).
type IssueComment struct {
	ID                int64
	Number            int
	User              string
	Body              string
	AuthorAssociation string
	CreatedAt         time.Time
}

func validName(s string) bool {
	return nameRE.MatchString(s) && s != "." && s != ".." && !strings.HasSuffix(s, ".git")
}

// CreateRepo creates the bare repository owner/name with one commit on branch main holding
// files (path → content), committed by "forge". The owner gets an installation if it has none.
func (f *Forge) CreateRepo(ownerLogin, name string, files map[string]string) error {
	return f.createRepo(ownerLogin, name, func(work string) error {
		for p, content := range files {
			clean := filepath.Clean(filepath.FromSlash(p))
			if filepath.IsAbs(clean) || clean == "." || strings.HasPrefix(clean, ".."+string(filepath.Separator)) || clean == ".." {
				return fmt.Errorf("forge: bad file path %q", p)
			}
			full := filepath.Join(work, clean)
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
				return err
			}
		}
		return nil
	}, "")
}

// SeedFromDir creates the bare repository owner/name with one commit on main holding the
// files of dir (a .git directory inside dir is ignored, .gitignore is honoured).
func (f *Forge) SeedFromDir(ownerLogin, name, dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if st, err := os.Stat(abs); err != nil || !st.IsDir() {
		return fmt.Errorf("forge: seed dir %q is not a directory", dir)
	}
	return f.createRepo(ownerLogin, name, nil, abs)
}

// createRepo either fills a fresh temporary work tree (fill) or commits workTree as it is.
func (f *Forge) createRepo(ownerLogin, name string, fill func(string) error, workTree string) error {
	if !validName(ownerLogin) || !validName(name) {
		return fmt.Errorf("forge: invalid repository name %q/%q", ownerLogin, name)
	}
	f.writeMu.Lock()
	defer f.writeMu.Unlock()
	f.mu.Lock()
	_, exists := f.repos[strings.ToLower(ownerLogin+"/"+name)]
	if o := f.owners[strings.ToLower(ownerLogin)]; o != nil {
		ownerLogin = o.login // keep the owner's original spelling
	}
	f.mu.Unlock()
	if exists {
		return ErrRepoExists
	}
	dir := filepath.Join(f.repoRoot, ownerLogin, name+".git")
	if _, err := os.Stat(dir); err == nil {
		return ErrRepoExists
	}
	ctx := context.Background()
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	if _, err := f.runGit(ctx, "", nil, "init", "--quiet", "--bare", "--initial-branch=main", dir); err != nil {
		return err
	}
	if err := f.initialCommit(ctx, dir, fill, workTree); err != nil {
		_ = os.RemoveAll(dir)
		return err
	}
	f.mu.Lock()
	rp := f.registerLocked(ownerLogin, name, dir, "main")
	f.mu.Unlock()
	f.log.Info("forge: repository created", "repo", rp.fullName(), "id", rp.id)
	return nil
}

func (f *Forge) initialCommit(ctx context.Context, gitDir string, fill func(string) error, workTree string) error {
	tmp, err := os.MkdirTemp("", "forge-seed-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if workTree == "" {
		workTree = filepath.Join(tmp, "work")
		if err := os.Mkdir(workTree, 0o755); err != nil {
			return err
		}
		if err := fill(workTree); err != nil {
			return err
		}
	}
	env := append(f.commitEnv(), "GIT_INDEX_FILE="+filepath.Join(tmp, "index"))
	base := []string{"--git-dir=" + gitDir, "--work-tree=" + workTree}
	if _, err := f.runGit(ctx, workTree, env, append(base, "add", "-A", ".")...); err != nil {
		return err
	}
	tree, err := f.runGit(ctx, workTree, env, append(base, "write-tree")...)
	if err != nil {
		return err
	}
	commit, err := f.runGit(ctx, "", env, "--git-dir="+gitDir, "commit-tree", tree, "-m", "Initial commit")
	if err != nil {
		return err
	}
	_, err = f.runGit(ctx, "", env, "--git-dir="+gitDir, "update-ref", "refs/heads/main", commit)
	return err
}

// registerLocked records a repository (and its owner's installation). f.mu must be held.
func (f *Forge) registerLocked(ownerLogin, name, dir, defaultBranch string) *repo {
	o := f.owners[strings.ToLower(ownerLogin)]
	if o == nil {
		o = &owner{login: ownerLogin, id: f.newID(), installationID: f.newID(), createdAt: f.now().UTC()}
		f.owners[strings.ToLower(ownerLogin)] = o
		f.installations[o.installationID] = o
	}
	rp := &repo{id: f.newID(), owner: o, name: name, defaultBranch: defaultBranch, dir: dir, createdAt: f.now().UTC()}
	f.repos[strings.ToLower(rp.fullName())] = rp
	return rp
}

// loadExisting registers bare repositories left in DataDir by a previous run.
func (f *Forge) loadExisting(ctx context.Context) error {
	owners, err := os.ReadDir(f.repoRoot)
	if err != nil {
		return err
	}
	sort.Slice(owners, func(i, j int) bool { return owners[i].Name() < owners[j].Name() })
	for _, od := range owners {
		if !od.IsDir() || !validName(od.Name()) {
			continue
		}
		entries, err := os.ReadDir(filepath.Join(f.repoRoot, od.Name()))
		if err != nil {
			return err
		}
		for _, e := range entries {
			name := strings.TrimSuffix(e.Name(), ".git")
			if !e.IsDir() || name == e.Name() || !validName(name) {
				continue
			}
			dir := filepath.Join(f.repoRoot, od.Name(), e.Name())
			branch := "main"
			if ref, err := f.runGit(ctx, "", nil, "--git-dir="+dir, "symbolic-ref", "--short", "HEAD"); err == nil && ref != "" {
				branch = ref
			}
			f.mu.Lock()
			f.registerLocked(od.Name(), name, dir, branch)
			f.mu.Unlock()
		}
	}
	return nil
}

func (f *Forge) commitEnv() []string {
	date := fmt.Sprintf("@%d +0000", f.now().Unix())
	return []string{
		"GIT_AUTHOR_NAME=forge", "GIT_AUTHOR_EMAIL=forge@forge.invalid", "GIT_AUTHOR_DATE=" + date,
		"GIT_COMMITTER_NAME=forge", "GIT_COMMITTER_EMAIL=forge@forge.invalid", "GIT_COMMITTER_DATE=" + date,
	}
}

// gitEnv isolates git from the user's and the system's configuration.
func gitEnv(extra []string) []string {
	env := append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL="+os.DevNull, "GIT_TERMINAL_PROMPT=0", "LC_ALL=C")
	return append(env, extra...)
}

// runGit runs git and returns its trimmed stdout.
func (f *Forge) runGit(ctx context.Context, dir string, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, f.git, args...)
	cmd.Dir = dir
	cmd.Env = gitEnv(env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return strings.TrimSpace(stdout.String()), &gitError{args: args, err: err, stderr: strings.TrimSpace(stderr.String())}
	}
	return strings.TrimSpace(stdout.String()), nil
}

type gitError struct {
	args   []string
	err    error
	stderr string
}

func (e *gitError) Error() string {
	return fmt.Sprintf("forge: git %s: %v: %s", strings.Join(e.args, " "), e.err, e.stderr)
}

func (e *gitError) Unwrap() error { return e.err }

// branchSHA resolves refs/heads/branch; ok is false when the branch does not exist.
func (f *Forge) branchSHA(ctx context.Context, rp *repo, branch string) (string, bool) {
	if branch == "" || strings.HasPrefix(branch, "-") {
		return "", false
	}
	sha, err := f.runGit(ctx, "", nil, "--git-dir="+rp.dir, "rev-parse", "--verify", "--quiet", "refs/heads/"+branch+"^{commit}")
	if err != nil || sha == "" {
		return "", false
	}
	return sha, true
}

// isAncestor reports whether commit a is reachable from b.
func (f *Forge) isAncestor(ctx context.Context, rp *repo, a, b string) bool {
	_, err := f.runGit(ctx, "", nil, "--git-dir="+rp.dir, "merge-base", "--is-ancestor", a, b)
	return err == nil
}

var errMergeConflict = errors.New("merge conflict")
var errBaseMoved = errors.New("base branch moved")

// mergeBranches writes a commit merging headSHA into base (a merge commit, or a single-parent
// commit for squash) and moves refs/heads/base to it with a compare-and-swap. It uses plumbing
// (merge-tree --write-tree, commit-tree, update-ref) on the bare repository, so no work tree.
func (f *Forge) mergeBranches(ctx context.Context, rp *repo, base, baseSHA, headSHA, message string, squash bool) (string, error) {
	out, err := f.runGit(ctx, "", nil, "--git-dir="+rp.dir, "merge-tree", "--write-tree", "--no-messages", baseSHA, headSHA)
	if err != nil {
		var ge *gitError
		if errors.As(err, &ge) {
			var ee *exec.ExitError
			if errors.As(ge.err, &ee) && ee.ExitCode() == 1 {
				return "", errMergeConflict
			}
		}
		return "", err
	}
	tree := strings.SplitN(out, "\n", 2)[0]
	args := []string{"--git-dir=" + rp.dir, "commit-tree", tree, "-p", baseSHA}
	if !squash {
		args = append(args, "-p", headSHA)
	}
	args = append(args, "-m", message)
	commit, err := f.runGit(ctx, "", f.commitEnv(), args...)
	if err != nil {
		return "", err
	}
	if _, err := f.runGit(ctx, "", nil, "--git-dir="+rp.dir, "update-ref", "-m", "forge: merge", "refs/heads/"+base, commit, baseSHA); err != nil {
		return "", errBaseMoved
	}
	return commit, nil
}
