package stages

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/taskrunner/taskrunner/platform/redact"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/pr"
	"github.com/taskrunner/taskrunner/runner/repotoken"
)

// followupStages are the stages of a follow-up run. Explore is left out: the agent already
// knows the repository (its resumed conversation, or the change on the branch it is pointed
// at). Propose writes a new OpenSpec change for the revision (the first run's change is
// archived, and an archived change is a record, not something to edit), apply implements it
// and archive folds it into the specs, so the branch keeps one change per run.
var followupStages = []taskrunnerv1.TaskStage{
	taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE,
	taskrunnerv1.TaskStage_TASK_STAGE_APPLY,
	taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE,
}

func (r *run) stages() []taskrunnerv1.TaskStage {
	if r.task.FollowUp() {
		return followupStages
	}
	return stageOrder
}

// cloneBranch is the branch the run clones: the base, or the task branch for a follow-up.
func (r *run) cloneBranch() string {
	if r.task.FollowUp() {
		return r.ws.Branch()
	}
	return r.task.BaseBranch
}

// toolMarkers are files `openspec init --tools <agent>` writes for the agent's stage commands.
var toolMarkers = map[string]string{
	"claude": ".claude/commands/opsx/apply.md",
	"codex":  ".agents/skills/openspec-apply-change/SKILL.md",
}

// prepareOpenSpec runs `openspec init` when the checkout lacks OpenSpec or the agent's stage
// commands (always the case in a follow-up: the first run did not commit them), then keeps
// everything init and the agent tooling add out of the commits.
func (r *run) prepareOpenSpec(ctx context.Context) error {
	marker, ok := toolMarkers[r.opts.OpenSpecTool]
	missing := ok && !fileExists(filepath.Join(r.ws.Dir(), marker))
	if !r.ws.HasOpenSpec() || missing {
		r.logf("openspec init --tools %s", r.opts.OpenSpecTool)
		if err := r.ws.InitOpenSpec(ctx, r.opts.OpenSpecBin, r.opts.OpenSpecTool); err != nil {
			return err
		}
	}
	excluded, err := r.ws.ExcludeScaffolding(ctx)
	if err != nil {
		return err
	}
	if len(excluded) > 0 {
		r.logf("kept out of the pull request (added by openspec init): %s", strings.Join(excluded, ", "))
	}
	return nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// checkPR makes sure the follow-up's pull request exists, is open and is the task's, before
// any work is done; it fills in the PR's URL when the control plane gave none.
func (r *run) checkPR(ctx context.Context, tok repotoken.Token) error {
	r.target = pr.Target{Repo: r.task.Repo, Number: r.task.PRNumber, APIBaseURL: tok.APIBaseURL, Token: tok.Value,
		TraceParent: r.task.TraceParent, HTTPClient: r.opts.HTTPClient}
	url, head, state, err := pr.Get(ctx, r.target)
	if err != nil {
		return fmt.Errorf("pull request #%d: %w", r.task.PRNumber, err)
	}
	if head != r.ws.Branch() {
		return fmt.Errorf("pull request #%d is not this task's: its head is %q, not %q", r.task.PRNumber, head, r.ws.Branch())
	}
	if state != "open" {
		return fmt.Errorf("pull request #%d is %s: a follow-up revises an open pull request", r.task.PRNumber, state)
	}
	if r.task.PRURL == "" {
		r.task.PRURL = url
	}
	return nil
}

// followupPrompt is what a follow-up's propose stage is given: the original request, where
// the change so far is on the branch, and the follow-up. Its first line is fixed ("Follow-up
// on pull request #N") so that it reads the same whether or not the conversation resumed.
func (r *run) followupPrompt(ctx context.Context) (string, error) {
	dirs, err := r.ws.BranchChanges(ctx)
	if err != nil {
		r.log.Warn("cannot list the branch's OpenSpec changes", "err", err)
	}
	sofar := "the commits on this branch (no OpenSpec change was found)"
	if len(dirs) > 0 {
		sofar = strings.Join(dirs, ", ") + " (read its proposal.md, design.md, tasks.md and specs first)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Follow-up on pull request #%d (run %d of this task): revise the work on this branch.\n\n", r.task.PRNumber, r.task.run())
	fmt.Fprintf(&b, "The original request was:\n%s\n\n", strings.TrimSpace(r.task.Prompt))
	fmt.Fprintf(&b, "The change so far is on this branch: %s.\n\n", sofar)
	b.WriteString("Propose a new OpenSpec change for this follow-up (it is applied and archived next), keeping what was already done:\n")
	b.WriteString(strings.TrimSpace(r.task.Followup))
	return b.String(), nil
}

// links are the console and trace links of the PR text.
func (r *run) links() pr.Links {
	traceID := ""
	if parts := strings.Split(r.task.TraceParent, "-"); len(parts) == 4 {
		traceID = parts[1]
	}
	return pr.Links{ConsoleURL: pr.ConsoleLink(r.task.ConsoleURL, r.task.ID), TraceID: traceID,
		TraceURL: pr.TraceLink(r.task.TraceURLTemplate, traceID)}
}

// reportRevision ends a follow-up once its commits are pushed: a comment on the pull request
// with what changed (this run's diff), and the run added to the PR's description. The PR is
// the one the task already has; no new PR is opened.
func (r *run) reportRevision(ctx context.Context, tok repotoken.Token, run pr.Run, summary string) (pr.Opened, error) {
	files, err := r.ws.CommittedDiff(ctx)
	if err != nil {
		return pr.Opened{}, fmt.Errorf("diff: %w", err)
	}
	commits, err := r.ws.NewCommits(ctx)
	if err != nil {
		return pr.Opened{}, fmt.Errorf("commits: %w", err)
	}
	rev := pr.Revision{Run: run, Followup: r.red.String(r.task.Followup), Summary: summary, Commits: commits, Links: r.links()}
	if rev.Summary == "" {
		rev.Summary = r.red.String(redact.Truncate(r.lastText, 2000))
	}
	for _, f := range files {
		rev.Files = append(rev.Files, pr.FileStat{Path: f.Path, Additions: f.Additions, Deletions: f.Deletions, Binary: f.Binary})
	}
	t := r.target
	t.APIBaseURL, t.Token = tok.APIBaseURL, tok.Value
	if t.Repo == "" {
		t = pr.Target{Repo: r.task.Repo, Number: r.task.PRNumber, APIBaseURL: tok.APIBaseURL, Token: tok.Value,
			TraceParent: r.task.TraceParent, HTTPClient: r.opts.HTTPClient}
	}
	url, err := pr.Comment(ctx, t, r.red.String(rev.Markdown()))
	if err != nil {
		return pr.Opened{}, err
	}
	r.logf("commented on pull request #%d: %s", r.task.PRNumber, url)
	if err := pr.RecordRun(ctx, t, run); err != nil {
		// The comment says it all; the description is a summary.
		r.logf("warning: the run was not added to the pull request's description: %v", err)
	}
	return pr.Opened{URL: r.task.PRURL, Number: r.task.PRNumber}, nil
}
