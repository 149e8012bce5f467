package redact

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
)

// Mask replaces every secret.
const Mask = "[REDACTED]"

// builtin are the secret shapes always removed. Order matters only for readability: every
// pattern is applied in turn.
var builtin = []*regexp.Regexp{
	// PEM private keys (RSA, EC, PKCS#8, OpenSSH …), also when cut off before the END line.
	regexp.MustCompile(`-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(-----END [A-Z0-9 ]*PRIVATE KEY-----|\z)`),
	// GitHub tokens: installation (ghs_), personal (ghp_), OAuth (gho_), user-to-server (ghu_),
	// refresh (ghr_) and fine-grained personal tokens (github_pat_).
	regexp.MustCompile(`\bgh[pousr]_[A-Za-z0-9]{16,}`),
	regexp.MustCompile(`\bgithub_pat_[A-Za-z0-9_]{20,}`),
	// taskrunner API tokens.
	regexp.MustCompile(`\btrt_[A-Za-z0-9_\-]{8,}`),
	// Anthropic (sk-ant-…) and OpenAI-style (sk-…, sk-proj-…) keys.
	regexp.MustCompile(`\bsk-[A-Za-z0-9_\-]{16,}`),
	// Authorization header values.
	regexp.MustCompile(`(?i)\b(bearer|basic)\s+[A-Za-z0-9_\-\.=:+/]{16,}`),
	// Credentials in URLs: scheme://user:password@host.
	regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.\-]*://[^/\s:@]*:)[^/\s@]+@`),
}

// Redactor removes secrets from text. It is safe for concurrent use; AddLiteral may be called
// at any time (for example when a refreshed token arrives).
type Redactor struct {
	patterns []*regexp.Regexp

	mu       sync.RWMutex
	literals []string // longest first, so a secret containing another is masked whole
}

// New returns a Redactor with the built-in patterns plus extra regular expressions
// (TASKRUNNER_REDACT_PATTERNS). It fails on an invalid expression.
func New(extra []string) (*Redactor, error) {
	r := &Redactor{patterns: append([]*regexp.Regexp(nil), builtin...)}
	for _, p := range extra {
		if strings.TrimSpace(p) == "" {
			continue
		}
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, fmt.Errorf("redact pattern %q: %w", p, err)
		}
		r.patterns = append(r.patterns, re)
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
	for _, re := range r.patterns {
		s = re.ReplaceAllStringFunc(s, func(m string) string {
			// Keep the scheme://user: prefix of a URL credential and the scheme word of an
			// Authorization value, so the message still says what was there.
			sub := re.FindStringSubmatch(m)
			if len(sub) > 1 && sub[1] != "" && strings.HasPrefix(m, sub[1]) && !strings.HasPrefix(sub[1], "-----") {
				if strings.HasSuffix(m, "@") {
					return sub[1] + Mask + "@"
				}
				return sub[1] + " " + Mask
			}
			return Mask
		})
	}
	return s
}

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

// Truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	cut := n - len(mark)
	if cut < 0 {
		cut = 0
	}
	for cut > 0 && !utf8RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }
