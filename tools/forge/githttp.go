package forge

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/cgi"
	"os"
	"strings"
)

// serveGit serves git smart HTTP for /{owner}/{repo}.git/... through `git http-backend`.
// Credentials come as Basic auth (any user name, the token as password), the way git sends
// `x-access-token:<token>`. Missing credentials get a 401 with a Basic challenge so git asks
// its credential helpers; a valid token outside its scope gets 403. Clone and fetch need
// contents:read, push (git-receive-pack) needs contents:write.
func (f *Forge) serveGit(w http.ResponseWriter, r *http.Request) {
	parts := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 3)
	ownerLogin, name := parts[0], strings.TrimSuffix(parts[1], ".git")
	rest := ""
	if len(parts) == 3 {
		rest = parts[2]
	}
	push := rest == "git-receive-pack" || (rest == "info/refs" && r.URL.Query().Get("service") == "git-receive-pack")

	p, err := f.authenticate(r)
	if err != nil {
		w.Header().Set("WWW-Authenticate", `Basic realm="forge"`)
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	rp := f.lookupRepo(ownerLogin, name)
	if rp == nil || !validName(ownerLogin) || !validName(name) {
		http.Error(w, "Repository not found.", http.StatusNotFound)
		return
	}
	level := "read"
	if push {
		level = "write"
	}
	if !p.allows(rp, "contents", level) {
		f.log.Info("forge: git access refused", "repo", rp.fullName(), "token_id", p.id, "push", push)
		http.Error(w, "Permission to "+rp.fullName()+".git denied to "+p.id+".", http.StatusForbidden)
		return
	}

	// Hand http-backend the canonical path and no credentials: the token must not reach the
	// CGI environment (HTTP_AUTHORIZATION).
	r2 := r.Clone(r.Context())
	r2.Header.Del("Authorization")
	r2.URL.Path = "/" + rp.owner.login + "/" + rp.name + ".git/" + rest
	r2.URL.RawPath = ""
	if r2.ContentLength < 0 || len(r2.TransferEncoding) > 0 {
		// net/http/cgi refuses chunked bodies (git uses them for packs above http.postBuffer):
		// spool the body to a file so the CGI gets a CONTENT_LENGTH.
		spool, err := os.CreateTemp("", "forge-pack-")
		if err != nil {
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		defer func() {
			_ = spool.Close()
			_ = os.Remove(spool.Name())
		}()
		n, err := io.Copy(spool, r.Body)
		if err == nil {
			_, err = spool.Seek(0, io.SeekStart)
		}
		if err != nil {
			http.Error(w, "could not read request body", http.StatusBadRequest)
			return
		}
		r2.Body, r2.ContentLength, r2.TransferEncoding = spool, n, nil
		r2.Header.Del("Transfer-Encoding")
	}
	h := &cgi.Handler{
		Path: f.httpBackend,
		Dir:  f.repoRoot,
		Env: []string{
			"GIT_PROJECT_ROOT=" + f.repoRoot,
			"GIT_HTTP_EXPORT_ALL=1",
			"REMOTE_USER=" + p.id, // also enables receive-pack
			"GIT_CONFIG_NOSYSTEM=1",
			"GIT_CONFIG_GLOBAL=/dev/null",
		},
		InheritEnv: []string{"PATH", "HOME", "TMPDIR"},
		Logger:     slog.NewLogLogger(f.log.Handler(), slog.LevelWarn),
		Stderr:     slogWriter{f.log},
	}
	h.ServeHTTP(w, r2)
	if push && r.Method == http.MethodPost {
		f.log.Info("forge: push", "repo", rp.fullName(), "token_id", p.id)
	}
}

type slogWriter struct{ log *slog.Logger }

func (s slogWriter) Write(b []byte) (int, error) {
	s.log.Warn("forge: git http-backend", "stderr", strings.TrimSpace(string(b)))
	return len(b), nil
}
