package forge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-github/v62/github"
)

const docsURL = "https://docs.github.com/rest"

func (f *Forge) routes() http.Handler {
	api := http.NewServeMux()
	api.HandleFunc("GET /repos/{owner}/{repo}/installation", f.getRepoInstallation)
	api.HandleFunc("GET /app/installations/{id}", f.getInstallation)
	api.HandleFunc("POST /app/installations/{id}/access_tokens", f.createAccessToken)
	api.HandleFunc("GET /repos/{owner}/{repo}", f.getRepo)
	api.HandleFunc("GET /repos/{owner}/{repo}/branches/{branch...}", f.getBranch)
	api.HandleFunc("POST /repos/{owner}/{repo}/pulls", f.createPull)
	api.HandleFunc("GET /repos/{owner}/{repo}/pulls", f.listPulls)
	api.HandleFunc("GET /repos/{owner}/{repo}/pulls/{number}", f.getPull)
	api.HandleFunc("PATCH /repos/{owner}/{repo}/pulls/{number}", f.editPull)
	api.HandleFunc("PUT /repos/{owner}/{repo}/pulls/{number}/merge", f.mergePull)
	api.HandleFunc("GET /repos/{owner}/{repo}/pulls/{number}/merge", f.isMerged)
	api.HandleFunc("POST /repos/{owner}/{repo}/pulls/{number}/reviews", f.createReview)
	api.HandleFunc("GET /repos/{owner}/{repo}/pulls/{number}/reviews", f.listReviews)
	api.HandleFunc("GET /repos/{owner}/{repo}/pulls/{number}/reviews/{id}", f.getReview)
	api.HandleFunc("GET /repos/{owner}/{repo}/pulls/{number}/reviews/{id}/comments", f.listCommentsOfReview)
	api.HandleFunc("POST /repos/{owner}/{repo}/pulls/{number}/comments", f.createReviewComment)
	api.HandleFunc("GET /repos/{owner}/{repo}/pulls/{number}/comments", f.listReviewComments)
	api.HandleFunc("POST /repos/{owner}/{repo}/issues/{number}/comments", f.createIssueComment)
	api.HandleFunc("GET /repos/{owner}/{repo}/issues/{number}/comments", f.listIssueComments)
	api.HandleFunc("GET /repos/{owner}/{repo}/collaborators/{user}/permission", f.getPermission)
	api.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { writeError(w, http.StatusNotFound, "Not Found") })

	admin := http.NewServeMux()
	admin.HandleFunc("POST /_forge/repos", f.adminCreateRepo)
	admin.HandleFunc("PUT /_forge/repos/{owner}/{repo}/collaborators/{user}", f.adminSetCollaborator)
	admin.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { writeError(w, http.StatusNotFound, "Not Found") })

	apiRec := f.record("api", api)
	apiV3 := http.StripPrefix("/api/v3", apiRec)
	adminRec := f.record("admin", admin)
	gitRec := f.record("git", http.HandlerFunc(f.serveGit))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		switch {
		case strings.HasPrefix(p, actingPrefix):
			f.serveActing(w, r, apiRec)
		case strings.HasPrefix(p, "/_forge/"):
			adminRec.ServeHTTP(w, r)
		case isGitPath(p):
			gitRec.ServeHTTP(w, r)
		case strings.HasPrefix(p, "/api/v3/"):
			apiV3.ServeHTTP(w, r)
		default:
			apiRec.ServeHTTP(w, r)
		}
	})
}

// isGitPath matches /{owner}/{repo}.git[/...].
func isGitPath(p string) bool {
	parts := strings.SplitN(strings.TrimPrefix(p, "/"), "/", 3)
	return len(parts) >= 2 && parts[0] != "" && strings.HasSuffix(parts[1], ".git") && len(parts[1]) > len(".git")
}

type recKey struct{}

// record appends a Request before the handler runs (so it is visible as soon as the client has
// an answer); handlers fill in auth details through annotate, under f.mu.
func (f *Forge) record(kind string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &Request{Kind: kind, Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery}
		if kind != "git" && r.Body != nil {
			data, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
			if err != nil {
				writeError(w, http.StatusBadRequest, "Problems reading body")
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(data))
			var v any
			if len(data) > 0 && json.Unmarshal(data, &v) == nil {
				rec.Body = v
			}
		}
		f.mu.Lock()
		f.requests = append(f.requests, rec)
		f.mu.Unlock()
		sw := &statusWriter{ResponseWriter: w, f: f, rec: rec}
		next.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), recKey{}, rec)))
		if sw.rec.Status == 0 {
			sw.WriteHeader(http.StatusOK)
		}
	})
}

func (f *Forge) annotate(r *http.Request, fn func(*Request)) {
	rec, _ := r.Context().Value(recKey{}).(*Request)
	if rec == nil {
		return
	}
	f.mu.Lock()
	fn(rec)
	f.mu.Unlock()
}

type statusWriter struct {
	http.ResponseWriter
	f      *Forge
	rec    *Request
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
		s.f.mu.Lock()
		s.rec.Status = code
		s.f.mu.Unlock()
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.WriteHeader(http.StatusOK)
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Flush() {
	if fl, ok := s.ResponseWriter.(http.Flusher); ok {
		fl.Flush()
	}
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("X-GitHub-Media-Type", "github.v3; format=json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, errorBody{ErrorResponse: github.ErrorResponse{Message: msg, DocumentationURL: docsURL}, Status: strconv.Itoa(status)})
}

// writeValidation answers 422 the way GitHub does for an invalid pull request.
func writeValidation(w http.ResponseWriter, field, code, msg string) {
	writeInvalid(w, "PullRequest", field, code, msg)
}

// writeInvalid answers 422 "Validation Failed" with one error on resource.field.
func writeInvalid(w http.ResponseWriter, resource, field, code, msg string) {
	writeJSON(w, http.StatusUnprocessableEntity, errorBody{ErrorResponse: github.ErrorResponse{
		Message: "Validation Failed", DocumentationURL: docsURL,
		Errors: []github.Error{{Resource: resource, Field: field, Code: code, Message: msg}},
	}, Status: "422"})
}

func decodeBody(r *http.Request, v any) error {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	return json.Unmarshal(data, v)
}

func (f *Forge) baseURL(r *http.Request) string {
	if f.cfg.PublicURL != "" {
		return strings.TrimSuffix(f.cfg.PublicURL, "/")
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

func (f *Forge) lookupRepo(ownerLogin, name string) *repo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.repos[strings.ToLower(ownerLogin+"/"+name)]
}

// repoFor authenticates the request and resolves {owner}/{repo}; order of checks: credentials
// (401), repository (404), scope and permission (403). A token needs perm at level; an acting
// user needs a role of at least level.
func (f *Forge) repoFor(w http.ResponseWriter, r *http.Request, perm, level string) (*repo, *principal, bool) {
	return f.repoAccess(w, r, access{perms: []string{perm}, level: level, userLevel: level})
}

// access is what an endpoint requires: an installation token needs one of perms at level, an
// acting user a role of at least userLevel (a reader may comment and review on GitHub, but
// only a token with pull_requests or issues write may).
type access struct {
	perms     []string
	level     string
	userLevel string
}

func (f *Forge) repoAccess(w http.ResponseWriter, r *http.Request, need access) (*repo, *principal, bool) {
	p, err := f.authenticate(r)
	if err != nil {
		writeError(w, http.StatusUnauthorized, err.Error())
		return nil, nil, false
	}
	rp := f.lookupRepo(r.PathValue("owner"), r.PathValue("repo"))
	if rp == nil {
		writeError(w, http.StatusNotFound, "Not Found")
		return nil, nil, false
	}
	allowed := false
	if p.user != "" {
		allowed = f.userAllows(rp, p.user, need.userLevel)
	}
	for _, perm := range need.perms {
		allowed = allowed || p.allows(rp, perm, need.level)
	}
	if !allowed {
		msg := "Resource not accessible by integration"
		if p.user != "" {
			msg = "Must have " + need.userLevel + " access to the repository"
		}
		writeError(w, http.StatusForbidden, msg)
		return nil, nil, false
	}
	return rp, p, true
}

func (f *Forge) appAuth(w http.ResponseWriter, r *http.Request) bool {
	claims, err := f.verifyAppJWT(r)
	if err != nil {
		f.log.Info("forge: app JWT refused", "path", r.URL.Path, "reason", err.Error())
		writeError(w, http.StatusUnauthorized, err.Error())
		return false
	}
	f.annotate(r, func(rec *Request) { rec.JWTClaims = map[string]any(claims) })
	return true
}

func (f *Forge) getRepoInstallation(w http.ResponseWriter, r *http.Request) {
	if !f.appAuth(w, r) {
		return
	}
	rp := f.lookupRepo(r.PathValue("owner"), r.PathValue("repo"))
	if rp == nil {
		writeError(w, http.StatusNotFound, "Not Found")
		return
	}
	writeJSON(w, http.StatusOK, f.renderInstallation(f.baseURL(r), rp.owner))
}

func (f *Forge) installationFromPath(w http.ResponseWriter, r *http.Request) *owner {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	f.mu.Lock()
	o := f.installations[id]
	f.mu.Unlock()
	if err != nil || o == nil {
		writeError(w, http.StatusNotFound, "Not Found")
		return nil
	}
	return o
}

func (f *Forge) getInstallation(w http.ResponseWriter, r *http.Request) {
	if !f.appAuth(w, r) {
		return
	}
	if o := f.installationFromPath(w, r); o != nil {
		writeJSON(w, http.StatusOK, f.renderInstallation(f.baseURL(r), o))
	}
}

func (f *Forge) createAccessToken(w http.ResponseWriter, r *http.Request) {
	if !f.appAuth(w, r) {
		return
	}
	o := f.installationFromPath(w, r)
	if o == nil {
		return
	}
	var req tokenRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, "Problems parsing JSON")
		return
	}
	if len(req.Repositories)+len(req.RepositoryIDs) > 500 {
		writeError(w, http.StatusUnprocessableEntity, "Too many repositories requested (max 500)")
		return
	}
	text, tok, selected, err := f.mintToken(o, req)
	var unproc errUnprocessable
	switch {
	case errors.As(err, &unproc):
		writeError(w, http.StatusUnprocessableEntity, unproc.msg)
		return
	case err != nil:
		f.log.Error("forge: minting token", "err", err)
		writeError(w, http.StatusInternalServerError, "Internal error")
		return
	}
	f.annotate(r, func(rec *Request) { rec.IssuedTokenID = tok.id })
	f.log.Info("forge: installation token issued", "token_id", tok.id, "installation", o.installationID, "repositories", len(selected))
	base := f.baseURL(r)
	resp := tokenBody{
		InstallationToken:   &github.InstallationToken{Token: github.String(text), ExpiresAt: ts(tok.expiresAt), Permissions: permissionsStruct(tok.permissions)},
		RepositorySelection: "all",
	}
	if tok.repoIDs != nil {
		resp.RepositorySelection = "selected"
		resp.Repositories = make([]*github.Repository, 0, len(selected))
		for _, rp := range selected {
			resp.Repositories = append(resp.Repositories, f.renderRepo(base, rp))
		}
	}
	writeJSON(w, http.StatusCreated, resp)
}

func (f *Forge) getRepo(w http.ResponseWriter, r *http.Request) {
	rp, _, ok := f.repoFor(w, r, "metadata", "read")
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, f.renderRepo(f.baseURL(r), rp))
}

func (f *Forge) getBranch(w http.ResponseWriter, r *http.Request) {
	rp, _, ok := f.repoFor(w, r, "metadata", "read")
	if !ok {
		return
	}
	name := r.PathValue("branch")
	sha, found := f.branchSHA(r.Context(), rp, name)
	if !found {
		writeError(w, http.StatusNotFound, "Branch not found")
		return
	}
	base := f.baseURL(r)
	writeJSON(w, http.StatusOK, &github.Branch{
		Name: github.String(name), Protected: github.Bool(false),
		Commit: &github.RepositoryCommit{SHA: github.String(sha), URL: github.String(base + "/repos/" + rp.fullName() + "/commits/" + sha)},
	})
}

type newPull struct {
	Title string `json:"title"`
	Head  string `json:"head"`
	Base  string `json:"base"`
	Body  string `json:"body"`
	Draft bool   `json:"draft"`
}

func (f *Forge) createPull(w http.ResponseWriter, r *http.Request) {
	rp, p, ok := f.repoFor(w, r, "pull_requests", "write")
	if !ok {
		return
	}
	var in newPull
	if err := decodeBody(r, &in); err != nil {
		writeError(w, http.StatusBadRequest, "Problems parsing JSON")
		return
	}
	head := in.Head
	if o, b, found := strings.Cut(head, ":"); found {
		if !strings.EqualFold(o, rp.owner.login) {
			writeValidation(w, "head", "invalid", "")
			return
		}
		head = b
	}
	switch {
	case in.Title == "":
		writeValidation(w, "title", "missing_field", "")
		return
	case head == "":
		writeValidation(w, "head", "missing_field", "")
		return
	case in.Base == "":
		writeValidation(w, "base", "missing_field", "")
		return
	}
	ctx := r.Context()
	headSHA, found := f.branchSHA(ctx, rp, head)
	if !found {
		writeValidation(w, "head", "invalid", "")
		return
	}
	baseSHA, found := f.branchSHA(ctx, rp, in.Base)
	if !found {
		writeValidation(w, "base", "invalid", "")
		return
	}
	if head == in.Base || f.isAncestor(ctx, rp, headSHA, baseSHA) {
		writeValidation(w, "", "custom", fmt.Sprintf("No commits between %s and %s", in.Base, head))
		return
	}
	now := f.now().UTC().Truncate(time.Second)
	f.mu.Lock()
	for _, existing := range rp.pulls {
		if existing.State == "open" && existing.Head == head && existing.Base == in.Base {
			f.mu.Unlock()
			writeValidation(w, "", "custom", fmt.Sprintf("A pull request already exists for %s:%s.", rp.owner.login, head))
			return
		}
	}
	pr := &PullRequest{
		Repo: rp.fullName(), ID: f.newID(), Number: len(rp.pulls) + 1, Title: in.Title, Body: in.Body,
		Head: head, Base: in.Base, HeadSHA: headSHA, BaseSHA: baseSHA, State: "open", Draft: in.Draft,
		User: p.login(), CreatedAt: now, UpdatedAt: now,
	}
	rp.pulls = append(rp.pulls, pr)
	snapshot := *pr
	f.mu.Unlock()
	f.log.Info("forge: pull request opened", "repo", rp.fullName(), "number", pr.Number, "head", head, "base", in.Base)
	base := f.baseURL(r)
	f.sendPullRequestEvent(base, "opened", rp, snapshot, p.login())
	writeJSON(w, http.StatusCreated, f.renderPull(base, rp, snapshot))
}

// livePull returns a copy of a pull request with its branch tips refreshed while it is open.
func (f *Forge) livePull(ctx context.Context, rp *repo, pr PullRequest) PullRequest {
	if pr.State != "open" {
		return pr
	}
	if sha, ok := f.branchSHA(ctx, rp, pr.Head); ok {
		pr.HeadSHA = sha
	}
	if sha, ok := f.branchSHA(ctx, rp, pr.Base); ok {
		pr.BaseSHA = sha
	}
	return pr
}

func (f *Forge) listPulls(w http.ResponseWriter, r *http.Request) {
	rp, _, ok := f.repoFor(w, r, "pull_requests", "read")
	if !ok {
		return
	}
	q := r.URL.Query()
	state := q.Get("state")
	if state == "" {
		state = "open"
	}
	head := q.Get("head")
	if o, b, found := strings.Cut(head, ":"); found {
		if !strings.EqualFold(o, rp.owner.login) {
			writeJSON(w, http.StatusOK, []*github.PullRequest{})
			return
		}
		head = b
	}
	baseFilter := q.Get("base")
	f.mu.Lock()
	var pulls []PullRequest
	for _, pr := range rp.pulls {
		if (state == "all" || pr.State == state) && (head == "" || pr.Head == head) && (baseFilter == "" || pr.Base == baseFilter) {
			pulls = append(pulls, *pr)
		}
	}
	f.mu.Unlock()
	sort.Slice(pulls, func(i, j int) bool {
		if q.Get("direction") == "asc" {
			return pulls[i].Number < pulls[j].Number
		}
		return pulls[i].Number > pulls[j].Number
	})
	base := f.baseURL(r)
	out := make([]*github.PullRequest, 0, len(pulls))
	for _, pr := range pulls {
		out = append(out, f.renderPull(base, rp, f.livePull(r.Context(), rp, pr)))
	}
	writeJSON(w, http.StatusOK, out)
}

// pullFromPath resolves {number}; the returned pointer must only be read or written under f.mu.
func (f *Forge) pullFromPath(w http.ResponseWriter, r *http.Request, rp *repo) (*PullRequest, PullRequest, bool) {
	n, err := strconv.Atoi(r.PathValue("number"))
	f.mu.Lock()
	if err != nil || n < 1 || n > len(rp.pulls) {
		f.mu.Unlock()
		// Not under f.mu: writing the status records it under f.mu.
		writeError(w, http.StatusNotFound, "Not Found")
		return nil, PullRequest{}, false
	}
	ptr := rp.pulls[n-1]
	cur := *ptr
	f.mu.Unlock()
	return ptr, cur, true
}

func (f *Forge) getPull(w http.ResponseWriter, r *http.Request) {
	rp, _, ok := f.repoFor(w, r, "pull_requests", "read")
	if !ok {
		return
	}
	_, pr, ok := f.pullFromPath(w, r, rp)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, f.renderPull(f.baseURL(r), rp, f.livePull(r.Context(), rp, pr)))
}

func (f *Forge) isMerged(w http.ResponseWriter, r *http.Request) {
	rp, _, ok := f.repoFor(w, r, "pull_requests", "read")
	if !ok {
		return
	}
	_, pr, ok := f.pullFromPath(w, r, rp)
	if !ok {
		return
	}
	if !pr.Merged {
		writeError(w, http.StatusNotFound, "Not Found")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type pullUpdate struct {
	Title *string `json:"title"`
	Body  *string `json:"body"`
	State *string `json:"state"`
	Base  *string `json:"base"`
}

func (f *Forge) editPull(w http.ResponseWriter, r *http.Request) {
	rp, p, ok := f.repoFor(w, r, "pull_requests", "write")
	if !ok {
		return
	}
	ptr, cur, ok := f.pullFromPath(w, r, rp)
	if !ok {
		return
	}
	var in pullUpdate
	if err := decodeBody(r, &in); err != nil {
		writeError(w, http.StatusBadRequest, "Problems parsing JSON")
		return
	}
	ctx := r.Context()
	if in.State != nil && *in.State != "open" && *in.State != "closed" {
		writeValidation(w, "state", "invalid", "")
		return
	}
	if in.Base != nil {
		if cur.State != "open" {
			writeValidation(w, "base", "invalid", "Cannot change base branch of closed pull request.")
			return
		}
		if _, found := f.branchSHA(ctx, rp, *in.Base); !found {
			writeValidation(w, "base", "invalid", "")
			return
		}
	}
	if in.State != nil && *in.State == "open" && cur.Merged {
		writeValidation(w, "state", "invalid", "Cannot reopen a merged pull request.")
		return
	}
	live := f.livePull(ctx, rp, cur)
	now := f.now().UTC().Truncate(time.Second)
	action := ""
	f.mu.Lock()
	if in.Title != nil {
		ptr.Title = *in.Title
	}
	if in.Body != nil {
		ptr.Body = *in.Body
	}
	if in.Base != nil {
		ptr.Base = *in.Base
	}
	if in.State != nil && *in.State != ptr.State {
		ptr.State = *in.State
		if ptr.State == "closed" {
			action = "closed"
			ptr.ClosedAt = now
			ptr.HeadSHA, ptr.BaseSHA = live.HeadSHA, live.BaseSHA
		} else {
			action = "reopened"
			ptr.ClosedAt = time.Time{}
		}
	} else if in.Title != nil || in.Body != nil || in.Base != nil {
		action = "edited"
	}
	ptr.UpdatedAt = now
	updated := *ptr
	f.mu.Unlock()
	base := f.baseURL(r)
	updated = f.livePull(ctx, rp, updated)
	if action != "" {
		f.log.Info("forge: pull request "+action, "repo", rp.fullName(), "number", updated.Number)
		f.sendPullRequestEvent(base, action, rp, updated, p.login())
	}
	writeJSON(w, http.StatusOK, f.renderPull(base, rp, updated))
}

type mergeRequest struct {
	CommitTitle   string  `json:"commit_title"`
	CommitMessage *string `json:"commit_message"`
	SHA           string  `json:"sha"`
	MergeMethod   string  `json:"merge_method"`
}

func (f *Forge) mergePull(w http.ResponseWriter, r *http.Request) {
	rp, p, ok := f.repoFor(w, r, "pull_requests", "write")
	if !ok {
		return
	}
	var in mergeRequest
	if err := decodeBody(r, &in); err != nil {
		writeError(w, http.StatusBadRequest, "Problems parsing JSON")
		return
	}
	squash := false
	switch in.MergeMethod {
	case "", "merge":
	case "squash":
		squash = true
	default:
		writeValidation(w, "merge_method", "invalid", "The forge supports the merge methods merge and squash.")
		return
	}
	// One merge at a time per forge keeps the read-check-update sequence below simple; the
	// update-ref compare-and-swap still protects against a concurrent push to the base.
	f.writeMu.Lock()
	defer f.writeMu.Unlock()
	ptr, cur, ok := f.pullFromPath(w, r, rp)
	if !ok {
		return
	}
	if cur.State != "open" {
		writeError(w, http.StatusMethodNotAllowed, "Pull Request is not mergeable")
		return
	}
	if cur.Draft {
		writeError(w, http.StatusMethodNotAllowed, "Pull Request is still a draft")
		return
	}
	ctx := r.Context()
	headSHA, okH := f.branchSHA(ctx, rp, cur.Head)
	baseSHA, okB := f.branchSHA(ctx, rp, cur.Base)
	if !okH || !okB {
		writeError(w, http.StatusMethodNotAllowed, "Pull Request is not mergeable")
		return
	}
	if in.SHA != "" && in.SHA != headSHA {
		writeError(w, http.StatusConflict, "Head branch was modified. Review and try the merge again.")
		return
	}
	title := in.CommitTitle
	body := cur.Title
	if squash {
		body = ""
		if title == "" {
			title = fmt.Sprintf("%s (#%d)", cur.Title, cur.Number)
		}
	} else if title == "" {
		title = fmt.Sprintf("Merge pull request #%d from %s/%s", cur.Number, rp.owner.login, cur.Head)
	}
	if in.CommitMessage != nil {
		body = *in.CommitMessage
	}
	message := title
	if body != "" {
		message += "\n\n" + body
	}
	sha, err := f.mergeBranches(ctx, rp, cur.Base, baseSHA, headSHA, message, squash)
	switch {
	case errors.Is(err, errMergeConflict):
		writeError(w, http.StatusMethodNotAllowed, "Pull Request is not mergeable")
		return
	case errors.Is(err, errBaseMoved):
		writeError(w, http.StatusConflict, "Base branch was modified. Review and try the merge again.")
		return
	case err != nil:
		f.log.Error("forge: merge failed", "repo", rp.fullName(), "number", cur.Number, "err", err)
		writeError(w, http.StatusInternalServerError, "Internal error")
		return
	}
	now := f.now().UTC().Truncate(time.Second)
	f.mu.Lock()
	ptr.State, ptr.Merged, ptr.MergeCommitSHA, ptr.MergedBy = "closed", true, sha, p.login()
	ptr.MergedAt, ptr.ClosedAt, ptr.UpdatedAt = now, now, now
	ptr.HeadSHA, ptr.BaseSHA = headSHA, baseSHA
	merged := *ptr
	f.mu.Unlock()
	f.log.Info("forge: pull request merged", "repo", rp.fullName(), "number", merged.Number, "sha", sha)
	f.sendPullRequestEvent(f.baseURL(r), "closed", rp, merged, p.login())
	writeJSON(w, http.StatusOK, &github.PullRequestMergeResult{SHA: github.String(sha), Merged: github.Bool(true), Message: github.String("Pull Request successfully merged")})
}

type adminRepo struct {
	Owner string            `json:"owner"`
	Name  string            `json:"name"`
	Files map[string]string `json:"files"`
}

func (f *Forge) adminCreateRepo(w http.ResponseWriter, r *http.Request) {
	var in adminRepo
	if err := decodeBody(r, &in); err != nil {
		writeError(w, http.StatusBadRequest, "Problems parsing JSON")
		return
	}
	if !validName(in.Owner) || !validName(in.Name) {
		writeError(w, http.StatusUnprocessableEntity, "owner and name must match [A-Za-z0-9_.-]+")
		return
	}
	err := f.CreateRepo(in.Owner, in.Name, in.Files)
	switch {
	case errors.Is(err, ErrRepoExists):
		writeError(w, http.StatusUnprocessableEntity, "Repository already exists")
		return
	case err != nil:
		f.log.Error("forge: create repo", "err", err)
		writeError(w, http.StatusUnprocessableEntity, "Could not create repository")
		return
	}
	rp := f.lookupRepo(in.Owner, in.Name)
	writeJSON(w, http.StatusCreated, f.renderRepo(f.baseURL(r), rp))
}
