package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/user"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
)

// Agents the runner can drive.
const (
	AgentClaude = "claude"
	AgentCodex  = "codex"
)

// Config is the runner's whole configuration. Dispatch sets these variables in the sandbox.
type Config struct {
	TaskID     string `env:"TASKRUNNER_TASK_ID,required,notEmpty"`
	Repo       string `env:"TASKRUNNER_REPO,required,notEmpty"`
	BaseBranch string `env:"TASKRUNNER_BASE_BRANCH" envDefault:"main"`
	Prompt     string `env:"TASKRUNNER_PROMPT,required,notEmpty"`
	Agent      string `env:"TASKRUNNER_AGENT" envDefault:"claude"`

	// Run is the task's run this runner works on: 1 is the first run, N>1 a follow-up that
	// revises the task's open pull request (FollowupPrompt, PRNumber and PRURL are then set;
	// Prompt stays the original request).
	Run            int    `env:"TASKRUNNER_RUN" envDefault:"1"`
	FollowupPrompt string `env:"TASKRUNNER_FOLLOWUP_PROMPT"`
	PRNumber       int64  `env:"TASKRUNNER_PR_NUMBER"`
	PRURL          string `env:"TASKRUNNER_PR_URL"`
	// ConsoleURL is the console's base URL: the PR links <ConsoleURL>/tasks/<id> ("" : no link).
	ConsoleURL string `env:"TASKRUNNER_CONSOLE_URL"`
	// TraceURLTemplate links the trace from the PR: "{trace_id}" is replaced by the trace id
	// ("": the PR shows the bare trace id).
	TraceURLTemplate string `env:"TASKRUNNER_TRACE_URL_TEMPLATE"`

	EventsAddr string `env:"TASKRUNNER_EVENTS_ADDR,required,notEmpty"`
	// TokenAddr serves GitHubTokenService; empty means EventsAddr.
	TokenAddr  string `env:"TASKRUNNER_TOKEN_ADDR"`
	ServerName string `env:"TASKRUNNER_SERVER_NAME"`

	TLSCertFile string `env:"TASKRUNNER_TLS_CERT_FILE"`
	TLSKeyFile  string `env:"TASKRUNNER_TLS_KEY_FILE"`
	TLSCAFile   string `env:"TASKRUNNER_TLS_CA_FILE"`
	TLSCertPEM  string `env:"TASKRUNNER_TLS_CERT_PEM"`
	TLSKeyPEM   string `env:"TASKRUNNER_TLS_KEY_PEM"`
	TLSCAPEM    string `env:"TASKRUNNER_TLS_CA_PEM"`

	// ModelProxyAddr is the control plane's model proxy (host:port, mTLS with the task
	// certificate). When set, the agent CLIs reach the model only through a loopback forwarder
	// to it (runner/modelproxy): no model key is in the sandbox, and usage and the budget are
	// metered and enforced there.
	ModelProxyAddr string `env:"TASKRUNNER_MODEL_PROXY_ADDR"`

	TraceParent string `env:"TRACEPARENT"`
	// Deadline is RFC 3339; empty means none (the control plane's reaper still applies).
	Deadline     string  `env:"TASKRUNNER_DEADLINE"`
	MaxTurns     int     `env:"TASKRUNNER_MAX_TURNS" envDefault:"50"`
	MaxBudgetUSD float64 `env:"TASKRUNNER_MAX_BUDGET_USD" envDefault:"0"`

	// WorkDir holds the clone and the agent's HOME; empty means a new temporary directory.
	WorkDir string `env:"TASKRUNNER_WORKDIR"`
	// AgentUser is the uid or user name the agent runs as when the runner is root.
	AgentUser   string `env:"TASKRUNNER_AGENT_USER" envDefault:"65534"`
	ClaudeBin   string `env:"TASKRUNNER_CLAUDE_BIN" envDefault:"claude"`
	CodexBin    string `env:"TASKRUNNER_CODEX_BIN" envDefault:"codex"`
	OpenSpecBin string `env:"TASKRUNNER_OPENSPEC_BIN" envDefault:"openspec"`
	GitBin      string `env:"TASKRUNNER_GIT_BIN" envDefault:"git"`
	// RedactPatterns are extra regular expressions, separated by newlines.
	RedactPatterns string `env:"TASKRUNNER_REDACT_PATTERNS"`
	LogLevel       string `env:"TASKRUNNER_LOG_LEVEL" envDefault:"info"`

	// Codex (TASKRUNNER_AGENT=codex). CodexBaseURL is the Responses API base URL (…/v1);
	// empty means OPENAI_BASE_URL, then https://api.openai.com/v1. OPENAI_API_KEY is passed
	// to the CLI.
	CodexBaseURL  string `env:"TASKRUNNER_CODEX_BASE_URL"`
	OpenAIBaseURL string `env:"OPENAI_BASE_URL"`
	CodexModel    string `env:"TASKRUNNER_CODEX_MODEL" envDefault:"gpt-5.5"`
	// CodexHome is the CLI's CODEX_HOME; empty means .codex in the agent's HOME.
	CodexHome string `env:"TASKRUNNER_CODEX_HOME"`
	// USD per million tokens: Codex reports token counts only, the runner prices them so that
	// TASKRUNNER_MAX_BUDGET_USD applies.
	CodexPriceInputPerMTok       float64 `env:"TASKRUNNER_CODEX_PRICE_INPUT_PER_MTOK" envDefault:"1.25"`
	CodexPriceCachedInputPerMTok float64 `env:"TASKRUNNER_CODEX_PRICE_CACHED_INPUT_PER_MTOK" envDefault:"0.125"`
	CodexPriceOutputPerMTok      float64 `env:"TASKRUNNER_CODEX_PRICE_OUTPUT_PER_MTOK" envDefault:"10"`
}

// Load reads the variables from environ ("KEY=value" entries, as os.Environ returns) and
// validates them.
func Load(environ []string) (Config, error) {
	vars := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	var c Config
	if err := env.ParseWithOptions(&c, env.Options{Environment: vars}); err != nil {
		return c, fmt.Errorf("configuration: %w", unwrapEnvErr(err))
	}
	if c.TokenAddr == "" {
		c.TokenAddr = c.EventsAddr
	}
	if c.CodexBaseURL == "" {
		c.CodexBaseURL = c.OpenAIBaseURL
	}
	if c.CodexBaseURL == "" {
		c.CodexBaseURL = "https://api.openai.com/v1"
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("configuration: %w", err)
	}
	return c, nil
}

// unwrapEnvErr rewrites the env library's aggregate error into lines that start with the
// variable name.
func unwrapEnvErr(err error) error {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return err
	}
	var out []error
	for _, e := range agg.Errors {
		var parse env.ParseError
		switch {
		case errors.As(e, &parse):
			out = append(out, fmt.Errorf("%s: invalid value for type %s", envName(parse.Name), parse.Type))
		default:
			out = append(out, e)
		}
	}
	return errors.Join(out...)
}

// envName maps a Config field name to its variable for messages.
func envName(field string) string {
	if f, ok := reflect.TypeFor[Config]().FieldByName(field); ok {
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		return name
	}
	return field
}

var (
	taskIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)
	repoRE   = regexp.MustCompile(`^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$`)
	// A git branch name the runner accepts: no "..", no leading "-", none of git's special
	// characters.
	branchRE      = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_./-]*$`)
	traceparentRE = regexp.MustCompile(`^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)
)

// Validate checks every field; each error names its variable.
func (c Config) Validate() error {
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", name, fmt.Sprintf(format, args...)))
	}
	if !taskIDRE.MatchString(c.TaskID) {
		bad("TASKRUNNER_TASK_ID", "want letters, digits, '-', '_' or '.', got %q", c.TaskID)
	}
	if !repoRE.MatchString(c.Repo) {
		bad("TASKRUNNER_REPO", "want owner/name, got %q", c.Repo)
	}
	if !branchRE.MatchString(c.BaseBranch) || strings.Contains(c.BaseBranch, "..") || strings.HasSuffix(c.BaseBranch, ".lock") {
		bad("TASKRUNNER_BASE_BRANCH", "not a valid branch name: %q", c.BaseBranch)
	}
	switch c.Agent {
	case AgentClaude:
	case AgentCodex:
		if u, err := url.Parse(c.CodexBaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("TASKRUNNER_CODEX_BASE_URL", "want an http(s) URL such as https://api.openai.com/v1, got %q", c.CodexBaseURL)
		}
		if strings.TrimSpace(c.CodexModel) == "" {
			bad("TASKRUNNER_CODEX_MODEL", "must not be empty")
		}
	default:
		bad("TASKRUNNER_AGENT", "want %q or %q, got %q", AgentClaude, AgentCodex, c.Agent)
	}
	for name, p := range map[string]float64{
		"TASKRUNNER_CODEX_PRICE_INPUT_PER_MTOK":        c.CodexPriceInputPerMTok,
		"TASKRUNNER_CODEX_PRICE_CACHED_INPUT_PER_MTOK": c.CodexPriceCachedInputPerMTok,
		"TASKRUNNER_CODEX_PRICE_OUTPUT_PER_MTOK":       c.CodexPriceOutputPerMTok,
	} {
		if p < 0 {
			bad(name, "must not be negative, got %g", p)
		}
	}
	for name, addr := range map[string]string{"TASKRUNNER_EVENTS_ADDR": c.EventsAddr, "TASKRUNNER_TOKEN_ADDR": c.TokenAddr, "TASKRUNNER_MODEL_PROXY_ADDR": c.ModelProxyAddr} {
		if addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(strings.TrimPrefix(strings.TrimPrefix(addr, "dns:///"), "passthrough:///")); err != nil {
			bad(name, "want host:port, got %q", addr)
		}
	}
	pair := func(what, file, pem string) {
		fileVar, pemVar := "TASKRUNNER_TLS_"+what+"_FILE", "TASKRUNNER_TLS_"+what+"_PEM"
		switch {
		case file != "" && pem != "":
			bad(fileVar, "set either %s or %s, not both", fileVar, pemVar)
		case file == "" && pem == "":
			bad(fileVar, "required (or %s)", pemVar)
		case file != "":
			if _, err := os.Stat(file); err != nil {
				bad(fileVar, "cannot read %q: %v", file, errors.Unwrap(err))
			}
		}
	}
	pair("CERT", c.TLSCertFile, c.TLSCertPEM)
	pair("KEY", c.TLSKeyFile, c.TLSKeyPEM)
	pair("CA", c.TLSCAFile, c.TLSCAPEM)
	if c.TraceParent != "" && !traceparentRE.MatchString(c.TraceParent) {
		bad("TRACEPARENT", "want a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>), got %q", c.TraceParent)
	}
	if c.Deadline != "" {
		if _, err := time.Parse(time.RFC3339, c.Deadline); err != nil {
			bad("TASKRUNNER_DEADLINE", "want RFC 3339 (2026-11-29T15:04:05Z), got %q", c.Deadline)
		}
	}
	switch {
	case c.Run < 1:
		bad("TASKRUNNER_RUN", "must be 1 or more, got %d", c.Run)
	case c.Run > 1:
		if strings.TrimSpace(c.FollowupPrompt) == "" {
			bad("TASKRUNNER_FOLLOWUP_PROMPT", "required for a follow-up run (TASKRUNNER_RUN=%d)", c.Run)
		}
		if c.PRNumber <= 0 {
			bad("TASKRUNNER_PR_NUMBER", "required for a follow-up run (TASKRUNNER_RUN=%d), got %d", c.Run, c.PRNumber)
		}
	}
	for name, u := range map[string]string{"TASKRUNNER_PR_URL": c.PRURL, "TASKRUNNER_CONSOLE_URL": c.ConsoleURL} {
		if u == "" {
			continue
		}
		if pu, err := url.Parse(u); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			bad(name, "want an http(s) URL, got %q", u)
		}
	}
	if c.MaxTurns <= 0 {
		bad("TASKRUNNER_MAX_TURNS", "must be positive, got %d", c.MaxTurns)
	}
	if c.MaxBudgetUSD < 0 {
		bad("TASKRUNNER_MAX_BUDGET_USD", "must not be negative (0 means no budget), got %g", c.MaxBudgetUSD)
	}
	if _, err := c.RedactRegexps(); err != nil {
		bad("TASKRUNNER_REDACT_PATTERNS", "%v", err)
	}
	if c.AgentUser == "" {
		bad("TASKRUNNER_AGENT_USER", "must not be empty")
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("TASKRUNNER_LOG_LEVEL", "want debug, info, warn or error, got %q", c.LogLevel)
	}
	return errors.Join(errs...)
}

// DeadlineTime parses Deadline; the zero time means none.
func (c Config) DeadlineTime() time.Time {
	t, err := time.Parse(time.RFC3339, c.Deadline)
	if err != nil {
		return time.Time{}
	}
	return t
}

// RedactRegexps returns the configured patterns, one per non-empty line.
func (c Config) RedactRegexps() ([]string, error) {
	var out []string
	for _, line := range strings.Split(c.RedactPatterns, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if _, err := regexp.Compile(line); err != nil {
			return nil, fmt.Errorf("pattern %q: %w", line, err)
		}
		out = append(out, line)
	}
	return out, nil
}

// ClientTLS builds the mTLS client configuration: the task certificate, the CA bundle that
// verifies the control plane, and ServerName (empty: the host of the dialled address).
func (c Config) ClientTLS() (*tls.Config, error) {
	read := func(fileVar, file, pem string) ([]byte, error) {
		if file == "" {
			return []byte(pem), nil
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fileVar, err)
		}
		return b, nil
	}
	certPEM, err := read("TASKRUNNER_TLS_CERT_FILE", c.TLSCertFile, c.TLSCertPEM)
	if err != nil {
		return nil, err
	}
	keyPEM, err := read("TASKRUNNER_TLS_KEY_FILE", c.TLSKeyFile, c.TLSKeyPEM)
	if err != nil {
		return nil, err
	}
	caPEM, err := read("TASKRUNNER_TLS_CA_FILE", c.TLSCAFile, c.TLSCAPEM)
	if err != nil {
		return nil, err
	}
	// X509KeyPair's errors describe the PEM structure, never the key bytes.
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("TASKRUNNER_TLS_CERT_*/TASKRUNNER_TLS_KEY_*: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("TASKRUNNER_TLS_CA_*: holds no PEM certificate")
	}
	serverName := c.ServerName
	if serverName == "" {
		if host, _, err := net.SplitHostPort(c.TokenAddr); err == nil {
			serverName = host
		}
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		ServerName:   serverName,
	}, nil
}

// TraceID returns the trace id of TraceParent, or "".
func (c Config) TraceID() string {
	if !traceparentRE.MatchString(c.TraceParent) {
		return ""
	}
	return strings.Split(c.TraceParent, "-")[1]
}

// AgentCredential resolves AgentUser to a uid and gid. A numeric uid without a passwd entry
// uses the same number as gid.
func (c Config) AgentCredential() (uid, gid uint32, err error) {
	if n, err := strconv.ParseUint(c.AgentUser, 10, 32); err == nil {
		if u, err := user.LookupId(c.AgentUser); err == nil {
			if g, err := strconv.ParseUint(u.Gid, 10, 32); err == nil {
				return uint32(n), uint32(g), nil
			}
		}
		return uint32(n), uint32(n), nil
	}
	u, err := user.Lookup(c.AgentUser)
	if err != nil {
		return 0, 0, fmt.Errorf("TASKRUNNER_AGENT_USER: %w", err)
	}
	uid64, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("TASKRUNNER_AGENT_USER: uid %q: %w", u.Uid, err)
	}
	gid64, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("TASKRUNNER_AGENT_USER: gid %q: %w", u.Gid, err)
	}
	return uint32(uid64), uint32(gid64), nil
}
