package console_test

import (
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/taskrunner/taskrunner/gateway/console"
	"github.com/taskrunner/taskrunner/gateway/rest"
)

func newConsole(t *testing.T, cfg console.Config) *console.Handler {
	t.Helper()
	h, err := console.New(cfg, nil)
	require.NoError(t, err)
	return h
}

// mount serves h's routes the way the gateway does, on a plain mux.
func mount(h *console.Handler) http.Handler {
	mux := http.NewServeMux()
	for p, hh := range h.Routes() {
		mux.Handle(p, hh)
	}
	return mux
}

func get(t *testing.T, h http.Handler, method, target string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, target, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestServesIndexAndAssets(t *testing.T) {
	h := mount(newConsole(t, console.Config{JaegerURL: console.DefaultJaegerURL}))

	w := get(t, h, http.MethodGet, "/")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, "text/html; charset=utf-8", w.Header().Get("Content-Type"))
	require.Contains(t, w.Body.String(), `<script type="module" src="/console/app.js"></script>`)
	require.Contains(t, w.Header().Get("Content-Security-Policy"), "script-src 'self'")
	require.Equal(t, "nosniff", w.Header().Get("X-Content-Type-Options"))
	require.Equal(t, "no-cache", w.Header().Get("Cache-Control"))

	for file, ct := range map[string]string{
		"app.js":    "text/javascript; charset=utf-8",
		"api.js":    "text/javascript; charset=utf-8",
		"model.js":  "text/javascript; charset=utf-8",
		"config.js": "text/javascript; charset=utf-8",
		"style.css": "text/css; charset=utf-8",
	} {
		w := get(t, h, http.MethodGet, console.AssetsPrefix+file)
		require.Equal(t, http.StatusOK, w.Code, file)
		require.Equal(t, ct, w.Header().Get("Content-Type"), file)
		require.NotEmpty(t, w.Body.String(), file)
	}

	// HEAD works, conditional requests get 304.
	w = get(t, h, http.MethodHead, "/console/app.js")
	require.Equal(t, http.StatusOK, w.Code)
	require.Empty(t, w.Body.String())
	etag := w.Header().Get("ETag")
	require.NotEmpty(t, etag)
	w = get(t, h, http.MethodGet, "/console/app.js", "If-None-Match", etag)
	require.Equal(t, http.StatusNotModified, w.Code)

	// index.html is served at / only, not under the assets prefix.
	require.Equal(t, http.StatusNotFound, get(t, h, http.MethodGet, "/console/index.html").Code)
	require.Equal(t, http.StatusNotFound, get(t, h, http.MethodGet, "/console/nope.js").Code)
	require.Equal(t, http.StatusNotFound, get(t, h, http.MethodGet, "/console/").Code)
	require.Equal(t, http.StatusNotFound, get(t, h, http.MethodGet, "/index.html").Code)
	require.Equal(t, http.StatusMethodNotAllowed, get(t, h, http.MethodPost, "/").Code)
}

func TestEveryReferencedAssetIsServed(t *testing.T) {
	h := mount(newConsole(t, console.Config{}))
	index := get(t, h, http.MethodGet, "/").Body.String()
	refs := regexp.MustCompile(`(?:src|href)="(/console/[^"]+)"`).FindAllStringSubmatch(index, -1)
	require.NotEmpty(t, refs)
	seen := map[string]bool{}
	var queue []string
	for _, m := range refs {
		queue = append(queue, m[1])
	}
	imports := regexp.MustCompile(`(?m)^\s*(?:import|export)\b[^"']*?from\s+["']([^"']+)["']`)
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if seen[p] {
			continue
		}
		seen[p] = true
		w := get(t, h, http.MethodGet, p)
		require.Equal(t, http.StatusOK, w.Code, "%s is referenced but not served", p)
		if strings.HasSuffix(p, ".js") {
			for _, m := range imports.FindAllStringSubmatch(w.Body.String(), -1) {
				require.True(t, strings.HasPrefix(m[1], "./"), "%s imports %q: only relative modules of the console", p, m[1])
				queue = append(queue, path.Join(path.Dir(p), m[1]))
			}
		}
	}
	require.True(t, seen["/console/config.js"], "app.js must import the config module")
}

func TestConfigModule(t *testing.T) {
	h := mount(newConsole(t, console.Config{JaegerURL: "https://jaeger.example.com/ui/", LogTailLines: 50}))
	body := get(t, h, http.MethodGet, console.ConfigPath).Body.String()
	m := regexp.MustCompile(`export default Object\.freeze\((\{.*\})\);`).FindStringSubmatch(body)
	require.NotNil(t, m, body)
	var cfg map[string]any
	require.NoError(t, json.Unmarshal([]byte(m[1]), &cfg))
	require.Equal(t, map[string]any{"jaegerUrl": "https://jaeger.example.com/ui", "logTailLines": float64(50), "traceApi": false}, cfg)

	// Defaults; an empty Jaeger URL hides the links.
	body = get(t, mount(newConsole(t, console.Config{})), http.MethodGet, console.ConfigPath).Body.String()
	require.Contains(t, body, `{"jaegerUrl":"","logTailLines":200,"traceApi":false}`)

	// A value cannot break out of the script.
	h = mount(newConsole(t, console.Config{JaegerURL: `http://x/</script><script>alert(1)</script>`}))
	require.NotContains(t, get(t, h, http.MethodGet, console.ConfigPath).Body.String(), "<")
}

func TestConfigValidate(t *testing.T) {
	for _, bad := range []string{"127.0.0.1:16686", "ftp://jaeger", "http://", "http://jaeger?x=1", "http://jaeger#frag", "javascript:alert(1)"} {
		err := console.Config{JaegerURL: bad}.Validate()
		require.Error(t, err, bad)
		require.Contains(t, err.Error(), "TASKRUNNER_CONSOLE_JAEGER_URL")
	}
	require.NoError(t, console.Config{JaegerURL: console.DefaultJaegerURL}.Validate())
	require.NoError(t, console.Config{}.Validate())
	err := console.Config{LogTailLines: -1}.Validate()
	require.ErrorContains(t, err, "TASKRUNNER_CONSOLE_LOG_LINES")
	_, err = console.New(console.Config{LogTailLines: 1 << 20}, nil)
	require.ErrorContains(t, err, "TASKRUNNER_CONSOLE_LOG_LINES")
	err = console.Config{JaegerQueryURL: "jaeger:16686"}.Validate()
	require.ErrorContains(t, err, "TASKRUNNER_CONSOLE_JAEGER_QUERY_URL")
}

// TestDoesNotShadowTheAPI mounts the console exactly as the gateway does
// (rest.Options.Extra) and checks that the API's own routes still answer.
func TestDoesNotShadowTheAPI(t *testing.T) {
	// Nothing listens there: the API answers with its own JSON errors.
	conn, err := grpc.NewClient("127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	sse := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "sse") })
	extra := map[string]http.Handler{"GET /v1/tasks/{id}/events": sse}
	for p, h := range newConsole(t, console.Config{}).Routes() {
		extra[p] = h
	}
	h, err := rest.Handler(ctx, rest.Options{Task: conn, Events: conn, MaxBodyBytes: 1 << 16,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Extra: extra})
	require.NoError(t, err)

	isIndex := func(w *httptest.ResponseRecorder) bool { return strings.Contains(w.Body.String(), "<!doctype html>") }

	w := get(t, h, http.MethodGet, "/")
	require.Equal(t, http.StatusOK, w.Code)
	require.True(t, isIndex(w))
	require.NotEmpty(t, w.Header().Get(rest.RequestIDHeader), "the console sits behind the gateway's middleware")

	w = get(t, h, http.MethodGet, "/healthz")
	require.Equal(t, http.StatusOK, w.Code)
	require.JSONEq(t, `{"status":"ok"}`, w.Body.String())

	w = get(t, h, http.MethodGet, "/openapi.json")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, "application/json", w.Header().Get("Content-Type"))
	require.True(t, json.Valid(w.Body.Bytes()))

	w = get(t, h, http.MethodGet, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	require.False(t, isIndex(w))
	require.True(t, json.Valid(w.Body.Bytes()), w.Body.String()) // its shape is the rest package's business

	require.Equal(t, "sse", get(t, h, http.MethodGet, "/v1/tasks/x/events").Body.String())

	for _, target := range []string{"/v1/tasks", "/v1/no-such-route", "/v1/"} {
		w = get(t, h, http.MethodGet, target)
		require.False(t, isIndex(w), target)
		require.Equal(t, "application/json", w.Header().Get("Content-Type"), target)
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &e), target)
		require.NotZero(t, e.Code, target)
	}
	w = get(t, h, http.MethodGet, "/no-such-page")
	require.Equal(t, http.StatusNotFound, w.Code)
	require.False(t, isIndex(w))
}

// TestNoExternalHosts keeps the console offline-capable: no absolute or
// protocol-relative URL in the shipped HTML, CSS and JavaScript (the Jaeger
// URL comes from the server's config module), no bare or remote imports.
func TestNoExternalHosts(t *testing.T) {
	absolute := regexp.MustCompile(`(?i)\b(?:https?|wss?|ftp)://`)
	protocolRelative := regexp.MustCompile(`(?i)(?:["'(=]|url\(\s*)//[a-z0-9]`)
	cssImport := regexp.MustCompile(`(?i)@import`)
	dynamicImport := regexp.MustCompile(`\bimport\s*\(`)
	files := 0
	err := fs.WalkDir(os.DirFS("static"), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		switch path.Ext(p) {
		case ".js", ".html", ".css":
		default:
			t.Errorf("static/%s: unexpected file type; extend this test to check it", p)
			return nil
		}
		files++
		b, err := fs.ReadFile(os.DirFS("static"), p)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, re := range []*regexp.Regexp{absolute, protocolRelative, cssImport, dynamicImport} {
				if m := re.FindString(line); m != "" {
					t.Errorf("static/%s:%d: %q refers to another host or loads code dynamically: %s", p, i+1, m, strings.TrimSpace(line))
				}
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.GreaterOrEqual(t, files, 5)
}

// TestModelJS runs the JavaScript unit checks of static/model.js (the
// stage drawing, formatting and client-side validation) when Node.js is
// installed.
func TestModelJS(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}
	out, err := exec.Command(node, "--no-warnings", "testdata/model_test.mjs").CombinedOutput()
	require.NoError(t, err, string(out))
	require.Equal(t, "ok\n", string(out))
}

// TestEveryElementTheScriptUsesExists: each $("id") of app.js names an
// element of index.html (a renamed or missing one fails only in a browser
// otherwise), and the task page has the follow-up box and the run history.
func TestEveryElementTheScriptUsesExists(t *testing.T) {
	h := mount(newConsole(t, console.Config{}))
	index := get(t, h, http.MethodGet, "/").Body.String()
	app := get(t, h, http.MethodGet, console.AssetsPrefix+"app.js").Body.String()
	ids := map[string]bool{}
	for _, m := range regexp.MustCompile(`\bid="([^"]+)"`).FindAllStringSubmatch(index, -1) {
		ids[m[1]] = true
	}
	used := regexp.MustCompile(`\$\("([a-z0-9-]+)"\)`).FindAllStringSubmatch(app, -1)
	require.NotEmpty(t, used)
	for _, m := range used {
		require.True(t, ids[m[1]], "app.js uses #%s, which index.html does not have", m[1])
	}
	for _, id := range []string{"followup-form", "followup-prompt", "followup-error", "runs", "runs-card", "budget", "owner-quota"} {
		require.True(t, ids[id], "the task page lacks #%s", id)
		require.Contains(t, app, `$("`+id+`")`, "app.js does not use #%s", id)
	}
	// The follow-up goes to the REST route the gateway serves.
	apiJS := get(t, h, http.MethodGet, console.AssetsPrefix+"api.js").Body.String()
	require.Contains(t, apiJS, "`${taskPath(id)}:followup`")
}
