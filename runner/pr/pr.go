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
	hc := req.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: 60 * time.Second}
	}
	base := hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	hc = &http.Client{Timeout: hc.Timeout, Transport: otelhttp.NewTransport(traceTransport{base: base, traceparent: req.TraceParent})}
	client := github.NewClient(hc).WithAuthToken(req.Token)
	if req.APIBaseURL != "" {
		u, err := url.Parse(strings.TrimRight(req.APIBaseURL, "/") + "/")
		if err != nil {
			return Opened{}, fmt.Errorf("pr: bad API base URL: %w", err)
		}
		client.BaseURL = u
	}
	created, resp, err := client.PullRequests.Create(ctx, owner, name, &github.NewPullRequest{
		Title: github.String(req.Title),
		Head:  github.String(req.Head),
		Base:  github.String(req.Base),
		Body:  github.String(req.Body),
		Draft: github.Bool(req.Draft),
	})
	if err != nil {
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
				return Opened{}, fmt.Errorf("pr: create pull request: authentication failed: HTTP %d %s", ge.Response.StatusCode, detail)
			}
			return Opened{}, fmt.Errorf("pr: create pull request: HTTP %d %s", ge.Response.StatusCode, detail)
		}
		if resp != nil {
			return Opened{}, fmt.Errorf("pr: create pull request: HTTP %d", resp.StatusCode)
		}
		return Opened{}, fmt.Errorf("pr: create pull request: %w", err)
	}
	return Opened{URL: created.GetHTMLURL(), Number: int64(created.GetNumber())}, nil
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

// Body is the PR description: the proposal summary, the stage costs and the trace id; for a
// draft, why the work is incomplete.
func Body(taskID, summary string, costs []StageCost, traceID, incomplete string) string {
	var b strings.Builder
	if incomplete != "" {
		fmt.Fprintf(&b, "> **Incomplete**: the task stopped before finishing (%s). This draft holds the work so far.\n\n", incomplete)
	}
	if summary != "" {
		b.WriteString(clip(summary, 50_000))
		b.WriteString("\n\n")
	}
	b.WriteString("---\n")
	fmt.Fprintf(&b, "Opened by taskrunner for task `%s`.\n\n", taskID)
	if len(costs) > 0 {
		b.WriteString("| stage | cost (USD) |\n|---|---|\n")
		var total float64
		for _, c := range costs {
			fmt.Fprintf(&b, "| %s | %.4f |\n", c.Stage, c.CostUSD)
			total += c.CostUSD
		}
		fmt.Fprintf(&b, "| total | %.4f |\n\n", total)
	}
	if traceID != "" {
		fmt.Fprintf(&b, "Trace id: `%s`\n", traceID)
	}
	return b.String()
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "\n\n…"
}
