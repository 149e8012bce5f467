package redact

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"unicode/utf8"
)

// Mask replaces every secret.
const Mask = "[REDACTED]"

// rule is one secret shape and what replaces it: Mask, or a template that keeps a harmless
// prefix (the scheme://user: of a URL credential, the word of an Authorization value) so the
// message still says what was there.
type rule struct {
	re   *regexp.Regexp
	repl string
}

// builtin are the secret shapes always removed: the union of what the runner's log redactor,
// the task's failure-reason cleaner and the GitHub token service's error redactor matched
// before they became this one package (each case is in TestBuiltinUnion). Every rule is
// applied in turn, in this order; the ones keeping a prefix come first so a token inside
// them is not masked with its prefix.
var builtin = []rule{
	// PEM private keys (RSA, EC, PKCS#8, OpenSSH …), also when cut off before the END line.
	{regexp.MustCompile(`-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(-----END [A-Z0-9 ]*PRIVATE KEY-----|\z)`), Mask},
	// Credentials in URLs: scheme://user:password@host.
	{regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.\-]*://[^/\s:@]*:)[^/\s@]+@`), "${1}" + Mask + "@"},
	// git's token user outside a URL (x-access-token:<token>).
	{regexp.MustCompile(`(?i)\b(x-access-token:)[^@\s]+`), "${1}" + Mask},
	// GitHub tokens: installation (ghs_), personal (ghp_), OAuth (gho_), user-to-server (ghu_),
	// refresh (ghr_) and fine-grained personal tokens (github_pat_); 8 characters after the
	// prefix, the shortest any old redactor accepted.
	{regexp.MustCompile(`(?i)\bgh[pousr]_[A-Za-z0-9_]{8,}`), Mask},
	{regexp.MustCompile(`(?i)\bgithub_pat_[A-Za-z0-9_]{8,}`), Mask},
	// taskrunner API tokens.
	{regexp.MustCompile(`(?i)\btrt_[A-Za-z0-9_\-]{8,}`), Mask},
	// Anthropic (sk-ant-…) and OpenAI-style (sk-…, sk-proj-…) keys. The word boundary keeps
	// "task-0123…" identifiers intact.
	{regexp.MustCompile(`(?i)\bsk-[A-Za-z0-9_\-]{16,}`), Mask},
	// JSON Web Tokens (a GitHub App's signed assertion, OIDC tokens).
	{regexp.MustCompile(`\beyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*`), Mask},
	// Authorization header values: any bearer value, long basic credentials, and GitHub's
	// "token <value>" scheme.
	{regexp.MustCompile(`(?i)\b(bearer)\s+\S+`), "${1} " + Mask},
	{regexp.MustCompile(`(?i)\b(basic)\s+[A-Za-z0-9_\-\.=:+/]{16,}`), "${1} " + Mask},
	{regexp.MustCompile(`(?i)\b(token)\s+\S{20,}`), "${1} " + Mask},
}

// Redactor removes secrets from text. It is safe for concurrent use; AddLiteral may be called
// at any time (for example when a refreshed token arrives).
type Redactor struct {
	rules []rule

	mu       sync.RWMutex
	literals []string // longest first, so a secret containing another is masked whole
}

// New returns a Redactor with the built-in patterns plus extra regular expressions
// (TASKRUNNER_REDACT_PATTERNS). It fails on an invalid expression.
func New(extra []string) (*Redactor, error) {
	r := &Redactor{rules: append([]rule(nil), builtin...)}
	for _, p := range extra {
		if strings.TrimSpace(p) == "" {
			continue
		}
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, fmt.Errorf("redact pattern %q: %w", p, err)
		}
		r.rules = append(r.rules, rule{re, Mask})
	}
	return r, nil
}

// AddLiteral registers the exact text of a secret (a token, an API key). Texts shorter than 6
// characters are ignored: masking them would destroy ordinary words.
func (r *Redactor) AddLiteral(secret string) {
	if len(secret) < 6 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.literals {
		if l == secret {
			return
		}
	}
	r.literals = append(r.literals, secret)
	sort.Slice(r.literals, func(i, j int) bool { return len(r.literals[i]) > len(r.literals[j]) })
}

// std is the Redactor of String: the built-in patterns only.
var std = &Redactor{rules: builtin}

// String returns s with every built-in secret shape replaced by Mask, for text that has no
// literal secrets or configured patterns to add (failure reasons, error messages).
func String(s string) string { return std.String(s) }

// String returns s with every secret replaced by Mask.
func (r *Redactor) String(s string) string {
	if s == "" {
		return s
	}
	r.mu.RLock()
	for _, l := range r.literals {
		s = strings.ReplaceAll(s, l, Mask)
	}
	r.mu.RUnlock()
	for _, ru := range r.rules {
		s = ru.re.ReplaceAllString(s, ru.repl)
	}
	return s
}

// Clean returns s redacted and cut to at most n bytes (Truncate), such that cleaning the
// result again changes nothing: a cut can leave the start of a shape behind (a bearer value
// cut inside its mask), so it redacts and cuts until nothing changes.
func (r *Redactor) Clean(s string, n int) string {
	s = Truncate(r.String(s), n)
	for range 4 {
		next := Truncate(r.String(s), n)
		if next == s {
			break
		}
		s = next
	}
	return s
}

// Clean is Redactor.Clean with the built-in shapes only (failure reasons, error messages).
func Clean(s string, n int) string { return std.Clean(s, n) }

// ansi matches CSI sequences (colours, cursor movement), OSC sequences (titles, hyperlinks)
// and single-character escapes.
var ansi = regexp.MustCompile(`\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[@-Z\\-_]`)

// StripANSI removes terminal escape sequences and other control characters except tab.
func StripANSI(s string) string {
	s = ansi.ReplaceAllString(s, "")
	return strings.Map(func(r rune) rune {
		if r == '\t' || r >= 0x20 && r != 0x7f {
			return r
		}
		return -1
	}, s)
}

// Line strips escapes and redacts one log line.
func (r *Redactor) Line(s string) string { return r.String(StripANSI(s)) }

// Truncate cuts s to at most n bytes on a rune boundary, marking the cut with "…". The result
// is never longer than n (a negative n counts as 0), even when n leaves no room for the mark,
// and a rune is never split, so valid UTF-8 stays valid.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	if n < len(mark) {
		return s[:runeCut(s, n)]
	}
	return s[:runeCut(s, n-len(mark))] + mark
}

// TruncateCounted cuts s to at most n bytes on a rune boundary and says how much was cut, as
// in "text… [truncated 1234 bytes]", so a reader of a log tail knows the line went on. When n
// is too small for that mark, it falls back to Truncate.
func TruncateCounted(s string, n int) string {
	if len(s) <= n {
		return s
	}
	// The mark's length depends on the number it carries, which depends on where the cut
	// falls: start from the longest possible number and move the cut back once more if
	// needed (two rounds settle it; the loop bound is only a guard).
	keep := n - len(countedMark(len(s)))
	for range 4 {
		if keep < 0 {
			return Truncate(s, n)
		}
		cut := runeCut(s, keep)
		mark := countedMark(len(s) - cut)
		if cut+len(mark) <= n {
			return s[:cut] + mark
		}
		keep = n - len(mark)
	}
	return Truncate(s, n)
}

func countedMark(cut int) string { return fmt.Sprintf("… [truncated %d bytes]", cut) }

// runeCut returns the largest i <= n (and <= len(s)) at which s can be cut without splitting a
// rune, so a valid UTF-8 prefix stays valid. It looks back at most three bytes (a rune has at
// most four): a longer run of continuation bytes is not a rune, and cutting it anywhere is fine.
func runeCut(s string, n int) int {
	if n <= 0 {
		return 0
	}
	if n >= len(s) {
		return len(s)
	}
	for i := n; i >= 0 && i > n-utf8.UTFMax; i-- {
		if i == 0 || utf8.RuneStart(s[i]) {
			return i
		}
	}
	return n
}
