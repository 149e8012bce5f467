package forge

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-github/v62/github"
)

// What follow-up runs need from GitHub (issue 16): reviews, review comments, issue comments on
// pull requests, and collaborator permissions, with the webhooks GitHub sends for them.
//
// Like GitHub, the forge files every review comment under a review: a comment created on its
// own (POST .../pulls/{n}/comments) makes a COMMENTED review with an empty body, and both a
// pull_request_review_comment ("created") and a pull_request_review ("submitted") webhook go
// out. A receiver can therefore act on pull_request_review alone and list the review's
// comments.

// actingPrefix is the test-facing way to act as a user: /_forge/as/{login}/ followed by any REST
// path (with or without /api/v3) runs that REST endpoint as the user, so a go-github client with
// BaseURL {forge}/_forge/as/alice/ reviews, comments, closes and merges as alice. Like every
// /_forge/ endpoint it is unauthenticated. The user needs a role on the repository (see
// SetCollaborator): read to review and comment, write to edit, close and merge.
const actingPrefix = "/_forge/as/"

type actingKey struct{}

// loginRE is GitHub's login syntax, plus the "[bot]" suffix of app users.
var loginRE = regexp.MustCompile(`^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})(?:\[bot\])?$`)

func (f *Forge) serveActing(w http.ResponseWriter, r *http.Request, api http.Handler) {
	login, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, actingPrefix), "/")
	if !loginRE.MatchString(login) {
		writeError(w, http.StatusNotFound, "Not Found")
		return
	}
	rest = "/" + rest
	if after, ok := strings.CutPrefix(rest, "/api/v3/"); ok {
		rest = "/" + after
	}
	r2 := r.Clone(context.WithValue(r.Context(), actingKey{}, login))
	r2.URL.Path, r2.URL.RawPath = rest, ""
	r2.Header.Del("Authorization")
	api.ServeHTTP(w, r2)
}

// roles maps a collaborator role to the permission GitHub reports for it.
var roles = map[string]string{"admin": "admin", "maintain": "write", "write": "write", "triage": "read", "read": "read"}

// SetCollaborator gives login a role on the repository "owner/name": admin, maintain, write,
// triage or read; "none" removes it. The personal token's user (forge-user) is always admin.
func (f *Forge) SetCollaborator(fullName, login, role string) error {
	if !loginRE.MatchString(login) {
		return fmt.Errorf("forge: invalid login %q", login)
	}
	if _, ok := roles[role]; !ok && role != "none" {
		return fmt.Errorf("forge: unknown role %q (want admin, maintain, write, triage, read or none)", role)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	rp := f.repos[strings.ToLower(fullName)]
	if rp == nil {
		return fmt.Errorf("forge: no repository %q", fullName)
	}
	if role == "none" {
		delete(rp.collaborators, strings.ToLower(login))
		return nil
	}
	if rp.collaborators == nil {
		rp.collaborators = map[string]string{}
	}
	rp.collaborators[strings.ToLower(login)] = role
	return nil
}

// permissionLocked is login's permission on rp as GitHub reports it: admin, write, read or none.
// f.mu must be held.
func (f *Forge) permissionLocked(rp *repo, login string) string {
	if strings.EqualFold(login, personalLogin) {
		return "admin"
	}
	if p, ok := roles[rp.collaborators[strings.ToLower(login)]]; ok {
		return p
	}
	return "none"
}

func (f *Forge) userAllows(rp *repo, login, level string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return permLevel(f.permissionLocked(rp, login)) >= permLevel(level)
}

// associationLocked is GitHub's author_association of login on rp. f.mu must be held.
func (f *Forge) associationLocked(rp *repo, login string) string {
	switch {
	case strings.EqualFold(login, personalLogin):
		return "OWNER"
	case rp.collaborators[strings.ToLower(login)] != "":
		return "COLLABORATOR"
	}
	return "NONE"
}

func (f *Forge) getPermission(w http.ResponseWriter, r *http.Request) {
	rp, _, ok := f.repoFor(w, r, "metadata", "read")
	if !ok {
		return
	}
	login := r.PathValue("user")
	if !loginRE.MatchString(login) {
		writeError(w, http.StatusNotFound, "Not Found")
		return
	}
	f.mu.Lock()
	perm := f.permissionLocked(rp, login)
	f.mu.Unlock()
	writeJSON(w, http.StatusOK, &github.RepositoryPermissionLevel{Permission: github.String(perm), User: f.renderUser(f.baseURL(r), login)})
}

func (f *Forge) adminSetCollaborator(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Permission string `json:"permission"`
	}
	if err := decodeBody(r, &in); err != nil {
		writeError(w, http.StatusBadRequest, "Problems parsing JSON")
		return
	}
	if in.Permission == "" {
		in.Permission = "write" // GitHub's default for PUT .../collaborators/{user}
	}
	full := r.PathValue("owner") + "/" + r.PathValue("repo")
	if f.lookupRepo(r.PathValue("owner"), r.PathValue("repo")) == nil {
		writeError(w, http.StatusNotFound, "Not Found")
		return
	}
	if err := f.SetCollaborator(full, r.PathValue("user"), in.Permission); err != nil {
		writeInvalid(w, "Collaborator", "permission", "invalid", err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// commentAccess: a token needs pull_requests write (GitHub also accepts issues write for
// conversation comments); a user needs read access, as on GitHub.
var (
	reviewAccess  = access{perms: []string{"pull_requests"}, level: "write", userLevel: "read"}
	issueAccess   = access{perms: []string{"issues", "pull_requests"}, level: "write", userLevel: "read"}
	readPRsAccess = access{perms: []string{"pull_requests"}, level: "read", userLevel: "read"}
	readIssues    = access{perms: []string{"issues", "pull_requests"}, level: "read", userLevel: "read"}
)

var reviewStates = map[string]string{"APPROVE": "APPROVED", "REQUEST_CHANGES": "CHANGES_REQUESTED", "COMMENT": "COMMENTED"}

// lineRef is one review comment to be created, validated.
type lineRef struct {
	path, side, body string
	line             int
}

func (f *Forge) createReview(w http.ResponseWriter, r *http.Request) {
	rp, p, ok := f.repoAccess(w, r, reviewAccess)
	if !ok {
		return
	}
	_, cur, ok := f.pullFromPath(w, r, rp)
	if !ok {
		return
	}
	var in github.PullRequestReviewRequest
	if err := decodeBody(r, &in); err != nil {
		writeError(w, http.StatusBadRequest, "Problems parsing JSON")
		return
	}
	state, known := reviewStates[in.GetEvent()]
	user := p.login()
	switch {
	case in.Event == nil:
		// GitHub would create a PENDING review to be submitted later; the forge only has
		// submitted reviews.
		writeInvalid(w, "PullRequestReview", "event", "missing_field", "The forge needs event (APPROVE, REQUEST_CHANGES or COMMENT); pending reviews are not supported.")
		return
	case !known:
		writeInvalid(w, "PullRequestReview", "event", "invalid", "")
		return
	case state == "CHANGES_REQUESTED" && strings.TrimSpace(in.GetBody()) == "":
		writeInvalid(w, "PullRequestReview", "body", "missing_field", "Review body is required when requesting changes.")
		return
	case state == "COMMENTED" && strings.TrimSpace(in.GetBody()) == "" && len(in.Comments) == 0:
		writeInvalid(w, "PullRequestReview", "body", "missing_field", "Review body or comments are required when commenting.")
		return
	case state != "COMMENTED" && strings.EqualFold(user, cur.User):
		verb := map[string]string{"APPROVED": "approve", "CHANGES_REQUESTED": "request changes on"}[state]
		writeInvalid(w, "PullRequestReview", "", "custom", "Can not "+verb+" your own pull request")
		return
	}
	ctx := r.Context()
	cur = f.livePull(ctx, rp, cur)
	refs := make([]lineRef, 0, len(in.Comments))
	for _, c := range in.Comments {
		ref := lineRef{path: c.GetPath(), side: c.GetSide(), body: c.GetBody(), line: c.GetLine()}
		if msg := f.checkLine(ctx, rp, cur, &ref); msg != "" {
			writeInvalid(w, "PullRequestReviewComment", "", "custom", msg)
			return
		}
		refs = append(refs, ref)
	}
	commit := cur.HeadSHA
	if in.CommitID != nil {
		commit = in.GetCommitID()
	}
	rv, comments, pr, ok := f.addReview(w, r, rp, user, state, in.GetBody(), commit, refs, 0)
	if !ok {
		return
	}
	pr = f.livePull(ctx, rp, pr)
	base := f.baseURL(r)
	f.log.Info("forge: review submitted", "repo", rp.fullName(), "number", pr.Number, "state", state, "comments", len(comments))
	for _, c := range comments {
		f.sendReviewCommentEvent(base, rp, pr, c)
	}
	f.sendReviewEvent(base, rp, pr, rv)
	writeJSON(w, http.StatusOK, f.renderReview(base, rp, rv))
}

// addReview stores a review and its comments (replyTo applies to the one comment of a reply)
// and returns copies; ok is false (and the answer written) when there is no such pull request.
func (f *Forge) addReview(w http.ResponseWriter, r *http.Request, rp *repo, user, state, body, commit string, refs []lineRef, replyTo int64) (Review, []ReviewComment, PullRequest, bool) {
	ptr, _, ok := f.pullFromPath(w, r, rp)
	if !ok {
		return Review{}, nil, PullRequest{}, false
	}
	now := f.now().UTC().Truncate(time.Second)
	f.mu.Lock()
	defer f.mu.Unlock()
	n := ptr.Number
	assoc := f.associationLocked(rp, user)
	rv := &Review{ID: f.newID(), Number: n, User: user, Body: body, State: state, CommitID: commit, AuthorAssociation: assoc, SubmittedAt: now}
	rp.reviews = append(rp.reviews, rv)
	comments := make([]ReviewComment, 0, len(refs))
	for _, ref := range refs {
		c := &ReviewComment{ID: f.newID(), ReviewID: rv.ID, Number: n, User: user, Body: ref.body, Path: ref.path, Line: ref.line,
			Side: ref.side, CommitID: commit, InReplyTo: replyTo, AuthorAssociation: assoc, CreatedAt: now}
		rp.reviewComments = append(rp.reviewComments, c)
		comments = append(comments, *c)
	}
	ptr.ReviewComments += len(refs)
	ptr.UpdatedAt = now
	pr := *ptr
	return *rv, comments, pr, true
}

// checkLine validates a review comment's place, fills in the default side and returns a
// message when it is not acceptable. GitHub wants the line to be inside a diff hunk; the forge
// accepts any line of a file the pull request changes (RIGHT: at the head, LEFT: at the merge
// base).
func (f *Forge) checkLine(ctx context.Context, rp *repo, pr PullRequest, ref *lineRef) string {
	if ref.side == "" {
		ref.side = "RIGHT"
	}
	switch {
	case strings.TrimSpace(ref.body) == "":
		return "Comment body is missing"
	case ref.path == "":
		return "Comment path is missing"
	case ref.side != "RIGHT" && ref.side != "LEFT":
		return "side must be LEFT or RIGHT"
	case ref.line < 1:
		return "line must be a positive line number of the diff (position is not supported)"
	}
	mergeBase, err := f.runGit(ctx, "", nil, "--git-dir="+rp.dir, "merge-base", pr.BaseSHA, pr.HeadSHA)
	if err != nil {
		return "Pull request has no merge base"
	}
	changed, err := f.runGit(ctx, "", nil, "--git-dir="+rp.dir, "diff", "--name-only", "-z", mergeBase, pr.HeadSHA)
	if err != nil || !containsNUL(changed, ref.path) {
		return "Path could not be resolved: " + ref.path + " is not changed by this pull request"
	}
	rev := pr.HeadSHA
	if ref.side == "LEFT" {
		rev = mergeBase
	}
	content, err := f.runGit(ctx, "", nil, "--git-dir="+rp.dir, "cat-file", "blob", rev+":"+ref.path)
	if err != nil {
		return fmt.Sprintf("Line could not be resolved: %s does not exist on the %s side", ref.path, ref.side)
	}
	if lines := bytes.Count([]byte(content), []byte("\n")) + 1; ref.line > lines {
		return fmt.Sprintf("Line could not be resolved: %s has %d lines on the %s side", ref.path, lines, ref.side)
	}
	return ""
}

func containsNUL(list, name string) bool {
	for _, s := range strings.Split(list, "\x00") {
		if s == name {
			return true
		}
	}
	return false
}

func (f *Forge) createReviewComment(w http.ResponseWriter, r *http.Request) {
	rp, p, ok := f.repoAccess(w, r, reviewAccess)
	if !ok {
		return
	}
	_, cur, ok := f.pullFromPath(w, r, rp)
	if !ok {
		return
	}
	var in struct {
		github.PullRequestComment
		// The REST parameter is in_reply_to (go-github's CreateCommentInReplyTo sends it);
		// in_reply_to_id is how answers name it.
		Reply *int64 `json:"in_reply_to"`
	}
	if err := decodeBody(r, &in); err != nil {
		writeError(w, http.StatusBadRequest, "Problems parsing JSON")
		return
	}
	ctx := r.Context()
	cur = f.livePull(ctx, rp, cur)
	ref := lineRef{path: in.GetPath(), side: in.GetSide(), body: in.GetBody(), line: in.GetLine()}
	var replyTo int64
	if in.Reply != nil || in.InReplyTo != nil {
		replyTo = in.GetInReplyTo()
		if in.Reply != nil {
			replyTo = *in.Reply
		}
		parent, found := f.findReviewComment(rp, cur.Number, replyTo)
		if !found {
			writeError(w, http.StatusNotFound, "Not Found")
			return
		}
		if strings.TrimSpace(ref.body) == "" {
			writeInvalid(w, "PullRequestReviewComment", "body", "missing_field", "")
			return
		}
		ref.path, ref.line, ref.side = parent.Path, parent.Line, parent.Side
		if parent.InReplyTo != 0 {
			replyTo = parent.InReplyTo // GitHub threads replies under the first comment
		}
	} else if msg := f.checkLine(ctx, rp, cur, &ref); msg != "" {
		writeInvalid(w, "PullRequestReviewComment", "", "custom", msg)
		return
	}
	commit := cur.HeadSHA
	if in.CommitID != nil {
		commit = in.GetCommitID()
	}
	rv, comments, pr, ok := f.addReview(w, r, rp, p.login(), "COMMENTED", "", commit, []lineRef{ref}, replyTo)
	if !ok {
		return
	}
	pr = f.livePull(ctx, rp, pr)
	base := f.baseURL(r)
	f.log.Info("forge: review comment created", "repo", rp.fullName(), "number", pr.Number, "path", ref.path, "line", ref.line)
	f.sendReviewCommentEvent(base, rp, pr, comments[0])
	f.sendReviewEvent(base, rp, pr, rv)
	writeJSON(w, http.StatusCreated, f.renderReviewComment(base, rp, comments[0]))
}

func (f *Forge) findReviewComment(rp *repo, number int, id int64) (ReviewComment, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range rp.reviewComments {
		if c.ID == id && c.Number == number {
			return *c, true
		}
	}
	return ReviewComment{}, false
}

func (f *Forge) listReviews(w http.ResponseWriter, r *http.Request) {
	rp, _, ok := f.repoAccess(w, r, readPRsAccess)
	if !ok {
		return
	}
	_, pr, ok := f.pullFromPath(w, r, rp)
	if !ok {
		return
	}
	base := f.baseURL(r)
	out := []*github.PullRequestReview{}
	for _, rv := range f.reviewsOf(rp, pr.Number) {
		out = append(out, f.renderReview(base, rp, rv))
	}
	writeJSON(w, http.StatusOK, out)
}

func (f *Forge) reviewsOf(rp *repo, number int) []Review {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Review
	for _, rv := range rp.reviews {
		if rv.Number == number {
			out = append(out, *rv)
		}
	}
	return out
}

// reviewFromPath resolves {number} and {id}; the answer is written when ok is false.
func (f *Forge) reviewFromPath(w http.ResponseWriter, r *http.Request) (*repo, Review, bool) {
	rp, _, ok := f.repoAccess(w, r, readPRsAccess)
	if !ok {
		return nil, Review{}, false
	}
	_, pr, ok := f.pullFromPath(w, r, rp)
	if !ok {
		return nil, Review{}, false
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err == nil {
		for _, rv := range f.reviewsOf(rp, pr.Number) {
			if rv.ID == id {
				return rp, rv, true
			}
		}
	}
	writeError(w, http.StatusNotFound, "Not Found")
	return nil, Review{}, false
}

func (f *Forge) getReview(w http.ResponseWriter, r *http.Request) {
	if rp, rv, ok := f.reviewFromPath(w, r); ok {
		writeJSON(w, http.StatusOK, f.renderReview(f.baseURL(r), rp, rv))
	}
}

func (f *Forge) listCommentsOfReview(w http.ResponseWriter, r *http.Request) {
	rp, rv, ok := f.reviewFromPath(w, r)
	if !ok {
		return
	}
	f.writeReviewComments(w, r, rp, func(c *ReviewComment) bool { return c.ReviewID == rv.ID })
}

func (f *Forge) listReviewComments(w http.ResponseWriter, r *http.Request) {
	rp, _, ok := f.repoAccess(w, r, readPRsAccess)
	if !ok {
		return
	}
	_, pr, ok := f.pullFromPath(w, r, rp)
	if !ok {
		return
	}
	f.writeReviewComments(w, r, rp, func(c *ReviewComment) bool { return c.Number == pr.Number })
}

func (f *Forge) writeReviewComments(w http.ResponseWriter, r *http.Request, rp *repo, keep func(*ReviewComment) bool) {
	f.mu.Lock()
	var comments []ReviewComment
	for _, c := range rp.reviewComments {
		if keep(c) {
			comments = append(comments, *c)
		}
	}
	f.mu.Unlock()
	base := f.baseURL(r)
	out := make([]*github.PullRequestComment, 0, len(comments))
	for _, c := range comments {
		out = append(out, f.renderReviewComment(base, rp, c))
	}
	writeJSON(w, http.StatusOK, out)
}

func (f *Forge) createIssueComment(w http.ResponseWriter, r *http.Request) {
	rp, p, ok := f.repoAccess(w, r, issueAccess)
	if !ok {
		return
	}
	var in github.IssueComment
	if err := decodeBody(r, &in); err != nil {
		writeError(w, http.StatusBadRequest, "Problems parsing JSON")
		return
	}
	if strings.TrimSpace(in.GetBody()) == "" {
		writeInvalid(w, "IssueComment", "body", "missing_field", "")
		return
	}
	user := p.login()
	now := f.now().UTC().Truncate(time.Second)
	// The forge has no issues, only pull requests: an issue number is a pull request number.
	ptr, _, ok := f.pullFromPath(w, r, rp)
	if !ok {
		return
	}
	f.mu.Lock()
	c := &IssueComment{ID: f.newID(), Number: ptr.Number, User: user, Body: in.GetBody(), AuthorAssociation: f.associationLocked(rp, user), CreatedAt: now}
	rp.issueComments = append(rp.issueComments, c)
	ptr.Comments++
	ptr.UpdatedAt = now
	pr, comment := *ptr, *c
	f.mu.Unlock()
	base := f.baseURL(r)
	f.log.Info("forge: issue comment created", "repo", rp.fullName(), "number", pr.Number)
	f.sendIssueCommentEvent(base, rp, f.livePull(r.Context(), rp, pr), comment)
	writeJSON(w, http.StatusCreated, f.renderIssueComment(base, rp, comment))
}

func (f *Forge) listIssueComments(w http.ResponseWriter, r *http.Request) {
	rp, _, ok := f.repoAccess(w, r, readIssues)
	if !ok {
		return
	}
	_, pr, ok := f.pullFromPath(w, r, rp)
	if !ok {
		return
	}
	f.mu.Lock()
	var comments []IssueComment
	for _, c := range rp.issueComments {
		if c.Number == pr.Number {
			comments = append(comments, *c)
		}
	}
	f.mu.Unlock()
	base := f.baseURL(r)
	out := make([]*github.IssueComment, 0, len(comments))
	for _, c := range comments {
		out = append(out, f.renderIssueComment(base, rp, c))
	}
	writeJSON(w, http.StatusOK, out)
}
