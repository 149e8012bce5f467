package console

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// Route patterns (net/http ServeMux syntax) served by Handler.
const (
	// IndexPattern matches the root path only, so it cannot shadow
	// anything else mounted on the same mux.
	IndexPattern = "GET /{$}"
	// AssetsPattern serves the embedded assets and the config module.
	AssetsPattern = "GET " + AssetsPrefix
	// AssetsPrefix is where the assets live.
	AssetsPrefix = "/console/"
	// ConfigPath is the generated configuration module.
	ConfigPath = AssetsPrefix + "config.js"
)

// Defaults.
const (
	DefaultJaegerURL    = "http://127.0.0.1:16686"
	DefaultLogTailLines = 200
	maxLogTailLines     = 5000
)

//go:embed static
var static embed.FS

// Config is what the page is told at load time (through ConfigPath). The
// env tags follow the gateway's configuration (github.com/caarlos0/env).
type Config struct {
	// JaegerURL is the base URL of the Jaeger UI; the console links a task
	// to JaegerURL + "/trace/" + trace_id. Empty hides the trace links.
	JaegerURL string `env:"TASKRUNNER_CONSOLE_JAEGER_URL" envDefault:"http://127.0.0.1:16686"`
	// JaegerQueryURL is the base URL of the Jaeger v1 query API
	// (GET /api/traces/{id}) that the task page's trace waterfall reads
	// through the gateway. Empty: JaegerURL (Jaeger serves its UI and query
	// API on one port).
	JaegerQueryURL string `env:"TASKRUNNER_CONSOLE_JAEGER_QUERY_URL"`
	// LogTailLines is how many log lines the task page keeps. Default 200.
	LogTailLines int `env:"TASKRUNNER_CONSOLE_LOG_LINES" envDefault:"200"`
}

func validURL(name, v string) error {
	if v == "" {
		return nil
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%s: want an absolute http(s) URL without query or fragment, got %q", name, v)
	}
	return nil
}

// Validate names the bad setting.
func (c Config) Validate() error {
	if err := validURL("TASKRUNNER_CONSOLE_JAEGER_URL", c.JaegerURL); err != nil {
		return err
	}
	if err := validURL("TASKRUNNER_CONSOLE_JAEGER_QUERY_URL", c.JaegerQueryURL); err != nil {
		return err
	}
	if c.LogTailLines < 0 || c.LogTailLines > maxLogTailLines {
		return fmt.Errorf("TASKRUNNER_CONSOLE_LOG_LINES: must be between 1 and %d (0 means %d), got %d", maxLogTailLines, DefaultLogTailLines, c.LogTailLines)
	}
	return nil
}

// asset is one embedded file, ready to serve.
type asset struct {
	body        []byte
	contentType string
	etag        string
}

// Handler serves the console. It is safe for concurrent use.
type Handler struct {
	assets map[string]asset // by URL path
	trace  *traceAPI
}

// contentTypes are set explicitly: mime.TypeByExtension reads the host's
// mime.types, which may not know .js or .mjs.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".svg":  "image/svg+xml",
}

// New validates cfg and returns the console handler. tasks is the Task
// service the trace route checks ownership with (GetTask under the caller's
// token); nil disables the trace route (it answers 501).
func New(cfg Config, tasks taskrunnerv1.TaskServiceClient) (*Handler, error) {
	if cfg.LogTailLines == 0 {
		cfg.LogTailLines = DefaultLogTailLines
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	query := strings.TrimRight(cmp.Or(cfg.JaegerQueryURL, cfg.JaegerURL), "/")
	h := &Handler{assets: map[string]asset{}, trace: &traceAPI{tasks: tasks, query: query, client: &http.Client{}}}
	err := fs.WalkDir(static, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		ct, ok := contentTypes[path.Ext(p)]
		if !ok {
			return fmt.Errorf("console: no content type for embedded file %s", p)
		}
		b, err := static.ReadFile(p)
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(p, "static/")
		if rel == "config.js" {
			return errors.New("console: static/config.js would hide the generated configuration")
		}
		urlPath := AssetsPrefix + rel
		if rel == "index.html" {
			urlPath = "/"
		}
		h.assets[urlPath] = newAsset(b, ct)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if _, ok := h.assets["/"]; !ok {
		return nil, errors.New("console: index.html is not embedded")
	}
	h.assets[ConfigPath] = newAsset(configModule(cfg, tasks != nil && query != ""), contentTypes[".js"])
	return h, nil
}

func newAsset(b []byte, ct string) asset {
	sum := sha256.Sum256(b)
	return asset{body: b, contentType: ct, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
}

// configModule renders cfg as an ES module. encoding/json escapes <, > and
// &, so no value can break out of the script.
func configModule(cfg Config, traceAPI bool) []byte {
	b, _ := json.Marshal(struct {
		JaegerURL    string `json:"jaegerUrl"`
		LogTailLines int    `json:"logTailLines"`
		TraceAPI     bool   `json:"traceApi"`
	}{strings.TrimRight(cfg.JaegerURL, "/"), cfg.LogTailLines, traceAPI})
	var buf bytes.Buffer
	buf.WriteString("// Generated by the gateway from its configuration.\nexport default Object.freeze(")
	buf.Write(b)
	buf.WriteString(");\n")
	return buf.Bytes()
}

// Routes maps each route pattern to h, for rest.Options.Extra.
func (h *Handler) Routes() map[string]http.Handler {
	return map[string]http.Handler{IndexPattern: h, AssetsPattern: h, TracePattern: h.trace}
}

// contentSecurityPolicy allows nothing but this origin: no inline script,
// no third-party host. Links (Jaeger, the pull request) are navigations,
// which CSP does not restrict.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// ServeHTTP serves index.html at "/" and the assets under AssetsPrefix;
// anything else is 404. Only GET and HEAD are allowed.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	a, ok := h.assets[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", a.contentType)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Content-Security-Policy", contentSecurityPolicy)
	// Small files: revalidate every time (the ETag makes it a 304), so a
	// new gateway never serves a page with stale modules.
	hd.Set("Cache-Control", "no-cache")
	hd.Set("ETag", a.etag)
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.body))
}
