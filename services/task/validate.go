package task

import (
	"regexp"
	"strings"
	"unicode"

	"github.com/google/uuid"

	"github.com/taskrunner/taskrunner/services/errs"
)

// Input limits.
const (
	MaxPromptBytes    = 32 << 10
	MaxBranchBytes    = 255
	MaxRequestIDBytes = 255
	DefaultBaseBranch = "main"
	defaultPageSize   = 20
	maxPageSize       = 100
)

// GitHub's rules: owner is 1–39 alphanumerics or single hyphens; repository
// names are 1–100 of [A-Za-z0-9._-] and not "." or "..".
var (
	ownerPattern = regexp.MustCompile(`^[A-Za-z0-9](?:[A-Za-z0-9]|-[A-Za-z0-9]){0,38}$`)
	namePattern  = regexp.MustCompile(`^[A-Za-z0-9._-]{1,100}$`)
)

// ValidateRepo checks an owner/name repository reference.
func ValidateRepo(field, repo string) error {
	owner, name, ok := strings.Cut(repo, "/")
	if !ok || strings.Contains(name, "/") {
		return errs.Invalid(field, "must be of the form owner/name, got %q", truncate(repo, 80))
	}
	if !ownerPattern.MatchString(owner) {
		return errs.Invalid(field, "owner %q is not a valid GitHub account name", truncate(owner, 80))
	}
	if !namePattern.MatchString(name) || name == "." || name == ".." || strings.HasSuffix(name, ".git") {
		return errs.Invalid(field, "repository name %q is not valid", truncate(name, 120))
	}
	return nil
}

// ValidateBranch applies git check-ref-format's rules to a branch name.
func ValidateBranch(field, b string) error {
	bad := func(why string) error {
		return errs.Invalid(field, "%q is not a valid branch name: %s", truncate(b, 80), why)
	}
	switch {
	case b == "":
		return errs.Invalid(field, "must not be empty")
	case len(b) > MaxBranchBytes:
		return errs.Invalid(field, "longer than %d bytes", MaxBranchBytes)
	case b == "@":
		return bad(`"@" alone`)
	case strings.HasPrefix(b, "/") || strings.HasSuffix(b, "/"):
		return bad("starts or ends with /")
	case strings.HasSuffix(b, "."):
		return bad("ends with .")
	case strings.HasPrefix(b, "-"):
		return bad("starts with -")
	case strings.Contains(b, ".."), strings.Contains(b, "//"), strings.Contains(b, "@{"):
		return bad(`contains "..", "//" or "@{"`)
	}
	for _, r := range b {
		if r < 0x20 || r == 0x7f || unicode.IsSpace(r) || strings.ContainsRune("~^:?*[\\", r) {
			return bad("contains a space, control character or one of ~^:?*[\\")
		}
	}
	for _, part := range strings.Split(b, "/") {
		if strings.HasPrefix(part, ".") || strings.HasSuffix(part, ".lock") {
			return bad(`a component starts with "." or ends with ".lock"`)
		}
	}
	return nil
}

// ValidateID checks a task id.
func ValidateID(field, id string) error {
	if id == "" {
		return errs.Invalid(field, "must not be empty")
	}
	if _, err := uuid.Parse(id); err != nil || len(id) != 36 {
		return errs.Invalid(field, "%q is not a task id (a UUID)", truncate(id, 80))
	}
	return nil
}

// NewTask is a validated create request.
type NewTask struct {
	Owner, Repo, BaseBranch, Prompt string
	Agent                           Agent
	IdempotencyKey                  string
	RetryOf                         string
}

// Validate checks and normalises the request.
func (n *NewTask) Validate() error {
	if strings.TrimSpace(n.Prompt) == "" {
		return errs.Invalid("prompt", "must not be empty")
	}
	if len(n.Prompt) > MaxPromptBytes {
		return errs.Invalid("prompt", "is %d bytes; the limit is %d (32 KiB)", len(n.Prompt), MaxPromptBytes)
	}
	if strings.ContainsRune(n.Prompt, 0) {
		return errs.Invalid("prompt", "must not contain NUL bytes")
	}
	if n.Repo == "" {
		return errs.Invalid("repo", "must not be empty")
	}
	if err := ValidateRepo("repo", n.Repo); err != nil {
		return err
	}
	if n.BaseBranch == "" {
		n.BaseBranch = DefaultBaseBranch
	}
	if err := ValidateBranch("base_branch", n.BaseBranch); err != nil {
		return err
	}
	switch n.Agent {
	case "":
		n.Agent = AgentClaude
	case AgentClaude, AgentCodex:
	default:
		return errs.Invalid("agent", "unknown agent %q (want claude or codex)", truncate(string(n.Agent), 40))
	}
	if len(n.IdempotencyKey) > MaxRequestIDBytes {
		return errs.Invalid("request_id", "longer than %d bytes", MaxRequestIDBytes)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
