// Package stages is the runner's core: it turns one run of a task into commits on the task's
// pull request. It gets a repository token, clones the base branch, makes sure OpenSpec is
// initialised, drives the agent through explore → propose → apply → archive, reports stage
// changes (from stage boundaries and from what the agent does), rate-limited redacted log
// tails, diff stats and usage, then commits, pushes taskrunner/<task-id> and opens the PR. It
// enforces the hard deadline, the budget, the turn cap and Cancel, and on timeout or a limit
// it saves the work so far in a draft PR. Every event goes through a Reporter, in order; the
// package must not talk to the Events service itself, read the environment or handle signals.
//
// Follow-ups (Task.Run > 1) revise the same pull request in a new sandbox. The run clones the
// task branch (not the base), runs `openspec init` again for the agent's stage commands, loads
// the previous run's agent session through SessionStore and restores it (the agent then
// resumes the conversation; without one it starts cold, from the branch and the prompt), and
// runs propose → apply → archive: explore is skipped (the conversation or the change on the
// branch already holds what it would find), propose gets the original request, where the
// change so far is on the branch (openspec/changes/**, archive included) and the follow-up,
// and writes a NEW OpenSpec change for the revision (the first run's change is archived: a
// record, not a draft), apply implements it and archive merges it into the specs. The
// timeline shows these three stage changes. The new commit goes on top of the branch with a
// plain push (nothing is rebased or forced); the run then comments on the PR (what was asked,
// the change's summary, the commits, this run's files with their line counts, the stages and
// their cost, console and trace links), adds the run to the PR description and reports
// completed{pr_url, pr_number} of that same PR. A follow-up's diff_stats are this run's own
// diff (`git diff --numstat <branch head at clone> HEAD`), its usage this run's own cost and
// tokens (a resumed conversation's cumulative figures minus the saved baseline); the first
// run's diff_stats are the whole PR (`git diff --numstat base...head`).
//
// Every run (completed, failed or cancelled, once a stage ran) saves the agent's session
// before its terminal event: redacted, at most 8 MiB compressed, bounded by SessionTimeout;
// a failure to save is logged and never fails the run.
//
// Pull request hygiene: after `openspec init`, every file it added and the agent tooling's
// directories (.claude/, .codex/, .agents/) go to .git/info/exclude, so only the repository's
// own files, the OpenSpec changes (openspec/changes/**) and specs (openspec/specs/**) are
// committed; a file the repository already tracks is committed when it changes.
package stages
