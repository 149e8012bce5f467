package pr

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-github/v62/github"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Request describes the pull request to open.
type Request struct {
	// Repo is owner/name.
	Repo        string
	Head, Base  string
	Title, Body string
	Draft       bool
	APIBaseURL  string
	Token       string
	TraceParent string
	HTTPClient  *http.Client
}

// Opened is the created pull request.
type Opened struct {
	URL    string
	Number int64
}

// traceTransport adds the W3C traceparent header to every API call.
type traceTransport struct {
	base        http.RoundTripper
	traceparent string
}

func (t traceTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	// With a live span, otelhttp has already injected the current context;
	// the explicit traceparent is the fallback without an SDK.
	if t.traceparent != "" && r.Header.Get("traceparent") == "" {
		r = r.Clone(r.Context())
		r.Header.Set("traceparent", t.traceparent)
	}
	return t.base.RoundTrip(r)
}

// Open creates the pull request.
func Open(ctx context.Context, req Request) (op Opened, err error) {
	ctx, span := otel.Tracer("github.com/taskrunner/taskrunner/runner/pr").Start(ctx, "github.pr.create",
		trace.WithAttributes(attribute.String("taskrunner.repo", req.Repo), attribute.Bool("taskrunner.draft", req.Draft)))
	defer func() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.SetAttributes(attribute.Int64("taskrunner.pr_number", op.Number))
		span.End()
	}()
	owner, name, ok := strings.Cut(req.Repo, "/")
	if !ok {
		return Opened{}, fmt.Errorf("pr: bad repository %q", req.Repo)
	}
	client, err := newClient(req.APIBaseURL, req.Token, req.TraceParent, req.HTTPClient)
	if err != nil {
		return Opened{}, err
	}
	created, resp, err := client.PullRequests.Create(ctx, owner, name, &github.NewPullRequest{
		Title: github.String(req.Title),
		Head:  github.String(req.Head),
		Base:  github.String(req.Base),
		Body:  github.String(req.Body),
		Draft: github.Bool(req.Draft),
	})
	if err != nil {
		return Opened{}, apiError("create pull request", resp, err)
	}
	return Opened{URL: created.GetHTMLURL(), Number: int64(created.GetNumber())}, nil
}

// newClient is a go-github client for the forge's REST API with the repository token, every
// call traced.
func newClient(apiBaseURL, token, traceparent string, hc *http.Client) (*github.Client, error) {
	if hc == nil {
		hc = &http.Client{Timeout: 60 * time.Second}
	}
	base := hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	hc = &http.Client{Timeout: hc.Timeout, Transport: otelhttp.NewTransport(traceTransport{base: base, traceparent: traceparent})}
	client := github.NewClient(hc).WithAuthToken(token)
	if apiBaseURL != "" {
		u, err := url.Parse(strings.TrimRight(apiBaseURL, "/") + "/")
		if err != nil {
			return nil, fmt.Errorf("pr: bad API base URL: %w", err)
		}
		client.BaseURL = u
	}
	return client, nil
}

// apiError describes a failed REST call without anything but the forge's own message.
func apiError(op string, resp *github.Response, err error) error {
	{
		var ge *github.ErrorResponse
		if errors.As(err, &ge) && ge.Response != nil {
			detail := ge.Message
			for _, e := range ge.Errors {
				if e.Message != "" {
					detail += "; " + e.Message
				} else if e.Code != "" {
					detail += "; " + e.Field + " " + e.Code
				}
			}
			if ge.Response.StatusCode == http.StatusUnauthorized || ge.Response.StatusCode == http.StatusForbidden {
				return fmt.Errorf("pr: %s: authentication failed: HTTP %d %s", op, ge.Response.StatusCode, detail)
			}
			return fmt.Errorf("pr: %s: HTTP %d %s", op, ge.Response.StatusCode, detail)
		}
		if resp != nil {
			return fmt.Errorf("pr: %s: HTTP %d", op, resp.StatusCode)
		}
		return fmt.Errorf("pr: %s: %w", op, err)
	}
}

// Change is what the PR text is made of.
type Change struct {
	// Name of the OpenSpec change ("" when the agent never got that far).
	Name string
	// Dir holds proposal.md (active or archived); may be "".
	Dir string
}

// Proposal reads the change's proposal.md: its title (the first heading, unless it is the
// generic "Proposal", then the change name) and its summary (the text after that heading).
func (c Change) Proposal() (title, summary string) {
	title = c.Name
	if c.Dir == "" {
		return title, ""
	}
	b, err := os.ReadFile(filepath.Join(c.Dir, "proposal.md"))
	if err != nil {
		return title, ""
	}
	text := strings.TrimSpace(string(b))
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		h = strings.TrimSpace(strings.TrimPrefix(strings.TrimPrefix(h, "Proposal:"), "Proposal -"))
		if h != "" && !strings.EqualFold(h, "proposal") && !strings.EqualFold(h, "change proposal") {
			title = h
		}
		text = strings.TrimSpace(strings.Join(lines[i+1:], "\n"))
		break
	}
	return title, text
}

// StageCost is one stage's cost for the PR body.
type StageCost struct {
	Stage   string
	CostUSD float64
}

// Links are where the PR text points to: the task in the console and its trace.
type Links struct {
	// ConsoleURL is the task's console page ("" : none).
	ConsoleURL string
	// TraceID is the task's trace id; TraceURL its page ("" : the bare id is shown).
	TraceID, TraceURL string
}

// ConsoleLink is <console>/tasks/<id> ("" without a console URL).
func ConsoleLink(console, taskID string) string {
	if console == "" {
		return ""
	}
	return strings.TrimRight(console, "/") + "/tasks/" + url.PathEscape(taskID)
}

// TraceLink fills "{trace_id}" in template ("" without a template or a trace id).
func TraceLink(template, traceID string) string {
	if template == "" || traceID == "" {
		return ""
	}
	return strings.ReplaceAll(template, "{trace_id}", traceID)
}

func (l Links) markdown() string {
	var parts []string
	if l.ConsoleURL != "" {
		parts = append(parts, fmt.Sprintf("[Task in the console](%s)", l.ConsoleURL))
	}
	switch {
	case l.TraceURL != "":
		parts = append(parts, fmt.Sprintf("[Trace `%s`](%s)", l.TraceID, l.TraceURL))
	case l.TraceID != "":
		parts = append(parts, fmt.Sprintf("Trace id: `%s`", l.TraceID))
	}
	return strings.Join(parts, " · ")
}

// Run is one run of the task in the PR text: its number, the OpenSpec change it made and its
// stages with their cost.
type Run struct {
	Number int
	Change string
	Costs  []StageCost
	// Incomplete says why the run stopped early ("" : it finished).
	Incomplete string
}

// The runs section of the body sits between these markers, so a follow-up can add its run.
const (
	runsStart = "<!-- taskrunner:runs -->"
	runsEnd   = "<!-- taskrunner:runs-end -->"
)

func (r Run) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "**Run %d**", r.Number)
	if r.Change != "" {
		fmt.Fprintf(&b, " · change `%s`", r.Change)
	}
	if r.Incomplete != "" {
		fmt.Fprintf(&b, " · incomplete (%s)", r.Incomplete)
	}
	b.WriteString("\n\n")
	if len(r.Costs) > 0 {
		b.WriteString("| stage | cost (USD) |\n|---|---|\n")
		var total float64
		for _, c := range r.Costs {
			fmt.Fprintf(&b, "| %s | %.4f |\n", c.Stage, c.CostUSD)
			total += c.CostUSD
		}
		fmt.Fprintf(&b, "| total | %.4f |\n", total)
	}
	return b.String()
}

// Body is the PR description: the proposal summary, the runs with their stages and costs, and
// links to the console and the trace; for a draft, why the work is incomplete.
func Body(taskID, summary string, run Run, links Links) string {
	var b strings.Builder
	if run.Incomplete != "" {
		fmt.Fprintf(&b, "> **Incomplete**: the task stopped before finishing (%s). This draft holds the work so far.\n\n", run.Incomplete)
	}
	if summary != "" {
		b.WriteString(clip(summary, 50_000))
		b.WriteString("\n\n")
	}
	b.WriteString("---\n")
	fmt.Fprintf(&b, "Opened by taskrunner for task `%s`.\n\n", taskID)
	b.WriteString(runsStart + "\n" + run.markdown() + "\n" + runsEnd + "\n\n")
	if l := links.markdown(); l != "" {
		b.WriteString(l + "\n")
	}
	return b.String()
}

// AddRun adds run to a body made by Body (at the end of its runs section, or at the end of a
// body without one).
func AddRun(body string, run Run) string {
	if i := strings.LastIndex(body, runsEnd); i >= 0 {
		return body[:i] + run.markdown() + "\n" + body[i:]
	}
	return strings.TrimRight(body, "\n") + "\n\n" + run.markdown()
}

// Target is an existing pull request and how to reach the forge's API.
type Target struct {
	// Repo is owner/name.
	Repo        string
	Number      int64
	APIBaseURL  string
	Token       string
	TraceParent string
	HTTPClient  *http.Client
}

func (t Target) client() (*github.Client, string, string, error) {
	owner, name, ok := strings.Cut(t.Repo, "/")
	if !ok {
		return nil, "", "", fmt.Errorf("pr: bad repository %q", t.Repo)
	}
	c, err := newClient(t.APIBaseURL, t.Token, t.TraceParent, t.HTTPClient)
	return c, owner, name, err
}

// Comment posts a comment on the pull request (an issue comment, as GitHub files a PR's
// conversation) and returns its URL.
func Comment(ctx context.Context, t Target, body string) (commentURL string, err error) {
	ctx, span := otel.Tracer("github.com/taskrunner/taskrunner/runner/pr").Start(ctx, "github.pr.comment",
		trace.WithAttributes(attribute.String("taskrunner.repo", t.Repo), attribute.Int64("taskrunner.pr_number", t.Number)))
	defer func() { endSpan(span, err) }()
	client, owner, name, err := t.client()
	if err != nil {
		return "", err
	}
	c, resp, err := client.Issues.CreateComment(ctx, owner, name, int(t.Number), &github.IssueComment{Body: github.String(clip(body, 60_000))})
	if err != nil {
		return "", apiError("comment on the pull request", resp, err)
	}
	return c.GetHTMLURL(), nil
}

// Get returns the pull request's URL, head branch and state ("open", "closed").
func Get(ctx context.Context, t Target) (htmlURL, head, state string, err error) {
	client, owner, name, err := t.client()
	if err != nil {
		return "", "", "", err
	}
	p, resp, err := client.PullRequests.Get(ctx, owner, name, int(t.Number))
	if err != nil {
		return "", "", "", apiError("get the pull request", resp, err)
	}
	return p.GetHTMLURL(), p.GetHead().GetRef(), p.GetState(), nil
}

// RecordRun adds run to the pull request's description (AddRun).
func RecordRun(ctx context.Context, t Target, run Run) (err error) {
	ctx, span := otel.Tracer("github.com/taskrunner/taskrunner/runner/pr").Start(ctx, "github.pr.edit",
		trace.WithAttributes(attribute.String("taskrunner.repo", t.Repo), attribute.Int64("taskrunner.pr_number", t.Number)))
	defer func() { endSpan(span, err) }()
	client, owner, name, err := t.client()
	if err != nil {
		return err
	}
	p, resp, err := client.PullRequests.Get(ctx, owner, name, int(t.Number))
	if err != nil {
		return apiError("get the pull request", resp, err)
	}
	body := AddRun(p.GetBody(), run)
	_, resp, err = client.PullRequests.Edit(ctx, owner, name, int(t.Number), &github.PullRequest{Body: github.String(clip(body, 60_000))})
	if err != nil {
		return apiError("edit the pull request", resp, err)
	}
	return nil
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "\n\n…"
}

// FileStat is one file of a run's diff.
type FileStat struct {
	Path                 string
	Additions, Deletions int64
	Binary               bool
}

// Revision is what a follow-up run did, for its comment on the pull request.
type Revision struct {
	Run Run
	// Followup is what the run was asked (quoted, clipped).
	Followup string
	// Summary describes the change (the run's OpenSpec proposal, or the agent's last words).
	Summary string
	// Commits are the new commits (short ids), oldest first.
	Commits []string
	// Files is the run's diff (what it pushed on top of the branch).
	Files []FileStat
	Links Links
}

// Markdown is the comment: what was asked, what changed, the files with their line counts
// (this run's diff only), the stages and their cost, and the links.
func (r Revision) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "**taskrunner run %d** pushed a revision", r.Run.Number)
	if r.Run.Incomplete != "" {
		fmt.Fprintf(&b, " (incomplete: %s)", r.Run.Incomplete)
	}
	b.WriteString(".\n\n")
	if f := strings.TrimSpace(r.Followup); f != "" {
		for _, l := range strings.Split(clip(f, 2000), "\n") {
			b.WriteString("> " + l + "\n")
		}
		b.WriteString("\n")
	}
	if s := strings.TrimSpace(r.Summary); s != "" {
		b.WriteString(clip(s, 4000) + "\n\n")
	}
	if len(r.Commits) > 0 {
		b.WriteString("Commits: ")
		for i, c := range r.Commits {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "`%s`", c)
		}
		b.WriteString("\n\n")
	}
	if len(r.Files) > 0 {
		var add, del int64
		b.WriteString("| file | + | − |\n|---|---|---|\n")
		for i, f := range r.Files {
			add += f.Additions
			del += f.Deletions
			if i >= 100 {
				continue
			}
			if f.Binary {
				fmt.Fprintf(&b, "| `%s` | binary | |\n", f.Path)
				continue
			}
			fmt.Fprintf(&b, "| `%s` | %d | %d |\n", f.Path, f.Additions, f.Deletions)
		}
		if len(r.Files) > 100 {
			fmt.Fprintf(&b, "| … %d more | | |\n", len(r.Files)-100)
		}
		fmt.Fprintf(&b, "| **%d files** | **%d** | **%d** |\n\n", len(r.Files), add, del)
	}
	b.WriteString(r.Run.markdown())
	if l := r.Links.markdown(); l != "" {
		b.WriteString("\n" + l + "\n")
	}
	return b.String()
}
