// Pure functions: the task state machine as the console draws it
// (ARCHITECTURE.md section 2), formatting, and client-side validation that
// mirrors the server's messages. No DOM here.

export const STAGES = ["TASK_STAGE_EXPLORE", "TASK_STAGE_PROPOSE", "TASK_STAGE_APPLY", "TASK_STAGE_ARCHIVE"];

export const TERMINAL = new Set(["TASK_STATUS_DONE", "TASK_STATUS_FAILED", "TASK_STATUS_CANCELLED"]);

/** Statuses in which a task may still produce events (the SSE stream stays open). */
export const LIVE = new Set(["TASK_STATUS_PROPOSING", "TASK_STATUS_QUEUED", "TASK_STATUS_RUNNING"]);

const AGENTS = { AGENT_CLAUDE: "Claude Code", AGENT_CODEX: "OpenAI Codex", AGENT_UNSPECIFIED: "Claude Code (default)" };

/** "TASK_STATUS_AWAITING_REVIEW" → "awaiting review". */
export function shortName(enumName, prefix) {
  if (!enumName || enumName.endsWith("_UNSPECIFIED")) return "";
  return enumName.replace(prefix, "").toLowerCase().replace(/_/g, " ");
}
export const statusLabel = (s) => shortName(s, "TASK_STATUS_") || "unknown";
export const stageLabel = (s) => shortName(s, "TASK_STAGE_");
export const agentLabel = (a) => AGENTS[a] || a || AGENTS.AGENT_UNSPECIFIED;

export function stageIndex(stage) {
  return STAGES.indexOf(stage);
}

/** The later of two stages (stages only move forward). */
export function laterStage(a, b) {
  return stageIndex(b) > stageIndex(a) ? b : a;
}

/**
 * outcomeOf maps a task to how its progress is drawn: "idle" (not started),
 * "running", "completed" (PR opened: every stage ran), "failed" or
 * "cancelled".
 */
export function outcomeOf(task) {
  switch (task.status) {
    case "TASK_STATUS_RUNNING": return "running";
    case "TASK_STATUS_AWAITING_REVIEW":
    case "TASK_STATUS_DONE": return "completed";
    case "TASK_STATUS_FAILED": return "failed";
    case "TASK_STATUS_CANCELLED": return task.pr_url ? "completed" : "cancelled"; // PR closed unmerged: all stages ran
    default: return "idle";
  }
}

/**
 * stageStates is the state of each of the four steps: "done", "active",
 * "failed", "stopped" or "pending".
 */
export function stageStates(stage, outcome) {
  const cur = stageIndex(stage);
  return STAGES.map((_, i) => {
    if (outcome === "completed") return "done";
    if (outcome === "idle" || i > cur) return "pending";
    if (i < cur) return "done";
    return { running: "active", failed: "failed", cancelled: "stopped" }[outcome] || "pending";
  });
}

export const STATE_TEXT = { done: "done", active: "in progress", failed: "failed", stopped: "stopped", pending: "pending" };

const n = (v) => Number(v || 0); // int64 fields arrive as strings
const fmtInt = (v) => n(v).toLocaleString("en-US");

export function formatDiff(d) {
  if (!d) return "";
  const files = n(d.files_changed ?? d.filesChanged);
  return `+${fmtInt(d.additions)} −${fmtInt(d.deletions)}, ${fmtInt(files)} ${files === 1 ? "file" : "files"}`;
}

export function formatUsage(u) {
  if (!u) return "";
  const usd = n(u.cost_usd ?? u.costUsd);
  const cost = `$${usd.toFixed(usd > 0 && usd < 1 ? 4 : 2)}`;
  return `${cost} · ${fmtInt(u.tokens_in ?? u.tokensIn)} tokens in, ${fmtInt(u.tokens_out ?? u.tokensOut)} out`;
}

/** Event payloads and tasks both use proto field names (diff_stats, files_changed). */
export function diffFromEvent(d) {
  return { additions: d.additions, deletions: d.deletions, files_changed: d.files_changed };
}
export function usageFromEvent(u) {
  return { cost_usd: u.cost_usd, tokens_in: u.tokens_in, tokens_out: u.tokens_out };
}

export function formatTime(ts) {
  if (!ts) return "";
  const d = new Date(ts);
  return Number.isNaN(d.getTime()) ? "" : d.toLocaleString();
}

function quote(s, max) {
  // Go's %q for the printable ASCII the form takes, with its truncation.
  const t = s.length > max ? s.slice(0, max) + "…" : s;
  return JSON.stringify(t);
}

const OWNER = /^[A-Za-z0-9](?:[A-Za-z0-9]|-[A-Za-z0-9]){0,38}$/;
const NAME = /^[A-Za-z0-9._-]{1,100}$/;

/**
 * validateCreate checks what the server would reject first, with the same
 * messages ("field: …"), so the user gets them without a round trip.
 * Returns {field: message}. The server remains the authority.
 */
export function validateCreate(req) {
  const errors = {};
  if (req.prompt.trim() === "") errors.prompt = "prompt: must not be empty";
  const repo = req.repo;
  if (repo === "") {
    errors.repo = "repo: must not be empty";
  } else {
    const slash = repo.indexOf("/");
    const owner = slash < 0 ? "" : repo.slice(0, slash);
    const name = slash < 0 ? "" : repo.slice(slash + 1);
    if (slash < 0 || name.includes("/")) errors.repo = `repo: must be of the form owner/name, got ${quote(repo, 80)}`;
    else if (!OWNER.test(owner)) errors.repo = `repo: owner ${quote(owner, 80)} is not a valid GitHub account name`;
    else if (!NAME.test(name) || name === "." || name === ".." || name.endsWith(".git")) errors.repo = `repo: repository name ${quote(name, 120)} is not valid`;
  }
  return errors;
}

// ---------------------------------------------------------------- daily work

/** The actions a task's page and row offer, by status. */
export function actionsFor(task) {
  const s = task ? task.status : "";
  return {
    dispatch: s === "TASK_STATUS_PROPOSING",
    cancel: !!s && !TERMINAL.has(s),
    // Cancelling an awaiting-review task closes its open pull request.
    cancelClosesPR: s === "TASK_STATUS_AWAITING_REVIEW",
    retry: s === "TASK_STATUS_FAILED" || s === "TASK_STATUS_CANCELLED",
    // A follow-up revises the pull request: while it awaits review, or
    // after a failed run that left one (FollowUpTask's own rule).
    followUp: s === "TASK_STATUS_AWAITING_REVIEW" || (s === "TASK_STATUS_FAILED" && !!(task && task.pr_url)),
  };
}

/** The page shows "● live" only once the task runs (not while proposing or queued). */
export function streamShowsLive(status) {
  return status === "TASK_STATUS_RUNNING" || status === "TASK_STATUS_AWAITING_REVIEW";
}

/** "user:alice" → "alice"; the control plane's actors keep their names. */
export function actorLabel(actor) {
  if (!actor) return "";
  return actor.startsWith("user:") ? actor.slice(5) : actor;
}

/** One line for a status_change event: "queued → running · by dispatch · capacity freed". */
export function statusChangeText(sc) {
  const parts = [`${sc.from ? statusLabel(sc.from) : "created"} → ${statusLabel(sc.to)}`];
  if (n(sc.queue_position) > 0 && sc.to === "TASK_STATUS_QUEUED") parts.push(`position ${n(sc.queue_position)} in the queue`);
  if (sc.actor) parts.push(`by ${actorLabel(sc.actor)}`);
  if (sc.reason) parts.push(sc.reason);
  return parts.join(" · ");
}

/** One line for a sandbox event: "sandbox started (process, id sb-1)". */
export function sandboxText(sb) {
  const what = [sb.provider, sb.sandbox_id ? `id ${sb.sandbox_id}` : ""].filter(Boolean).join(", ");
  return `sandbox ${sb.state || "changed"}${what ? ` (${what})` : ""}${sb.reason ? `: ${sb.reason}` : ""}`;
}

/** "position 2 in the queue" text for a queued task, "" otherwise. */
export function queueText(status, position) {
  if (status !== "TASK_STATUS_QUEUED") return "";
  const p = n(position);
  return p > 0 ? `#${p} in the dispatch queue${p === 1 ? " (next to start)" : ""}` : "waiting for capacity";
}

// Absolute paths inside the sandbox, up to and including the repository
// checkout: the runner works in <root>/repo where root is TASKRUNNER_WORKDIR
// (docker: /workspace; process provider: …/<sandbox>/work) or a temporary
// taskrunner-<task>-* directory.
const SANDBOX_REPO = /(?:\/[^\s"'`()<>:]*)?\/(?:workspace|work|taskrunner-[A-Za-z0-9._-]+)\/repo(?:\/|(?=[\s"'`):,]|$))/g;
const SANDBOX_HOME = /(?:\/[^\s"'`()<>:]*)?\/(?:workspace|work|taskrunner-[A-Za-z0-9._-]+)\/home(?:\/|(?=[\s"'`):,]|$))/g;
const WORKSPACE = /(^|[\s"'`(=])\/workspace\//g;

/** relativePaths makes the sandbox's absolute paths in a log line relative to the repository. */
export function relativePaths(line) {
  return line
    .replace(SANDBOX_REPO, (m) => (m.endsWith("/") ? "" : "."))
    .replace(SANDBOX_HOME, (m) => (m.endsWith("/") ? "~/" : "~"))
    .replace(WORKSPACE, "$1");
}

/**
 * stageCosts splits the agent's cumulative cost (usage events) by stage
 * (stage_change events mark the boundaries). events: [{type: "stage", stage}
 * | {type: "usage", cost}] in timeline order; a stage event's run (the
 * event's run, 0 or absent for the first) keeps a follow-up's stages apart
 * from the first run's. Returns [{stage, run, cost}] for the stages seen, in
 * order; usage before the first stage counts to it.
 */
export function stageCosts(events) {
  const out = [];
  let last = 0;
  let cur = null;
  let early = 0;
  for (const e of events) {
    if (e.type === "stage") {
      const run = n(e.run) || 1;
      if (!cur || cur.stage !== e.stage || cur.run !== run) {
        cur = { stage: e.stage, run, cost: 0 };
        if (!out.length) { cur.cost = early; early = 0; }
        out.push(cur);
      }
    } else if (e.type === "usage") {
      const c = n(e.cost);
      const d = Math.max(0, c - last);
      last = Math.max(last, c);
      if (cur) cur.cost += d; else early += d;
    }
  }
  return out;
}

/** "1.2 s", "340 ms", "2 min 5 s" for microseconds. */
export function formatDuration(us) {
  const v = n(us);
  if (v < 1000) return `${v} µs`;
  if (v < 1e6) return `${Math.round(v / 1000)} ms`;
  const s = v / 1e6;
  if (s < 60) return `${s.toFixed(1)} s`;
  return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
}

/** The bar of a waterfall span, in percent of the trace's duration. */
export function waterfallBar(span, total) {
  const t = Math.max(1, n(total));
  const left = Math.min(100, (n(span.start_us) / t) * 100);
  const width = Math.max(0.3, Math.min(100 - left, (n(span.duration_us) / t) * 100));
  return { left: +left.toFixed(2), width: +width.toFixed(2) };
}

/** "just now", "5 min", "3 h", "2 d" between ts and now (ms). */
export function formatAge(ts, now) {
  const t = new Date(ts).getTime();
  if (!ts || Number.isNaN(t)) return "";
  const s = Math.max(0, Math.round((now - t) / 1000));
  if (s < 60) return "just now";
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${Math.floor(s / 3600)} h`;
  return `${Math.floor(s / 86400)} d`;
}

/** The cost of a task for the list: "$0.29", "—" when nothing was spent. */
export function formatCost(u) {
  const usd = u ? n(u.cost_usd) : 0;
  return usd > 0 ? `$${usd.toFixed(usd < 1 ? 4 : 2)}` : "—";
}

export const STATUS_FILTERS = ["proposing", "queued", "running", "awaiting_review", "done", "failed", "cancelled"];

// ---------------------------------------------------------------- runs, follow-ups, budget

const TRIGGERS = { create: "first run", api: "follow-up", review: "review", comment: "comment" };

/** What started a run: "first run", "follow-up", "review", "comment". */
export function triggerLabel(trigger) {
  return TRIGGERS[trigger] || trigger || "first run";
}

/** "github:octocat" → "@octocat", "user:alice" → "alice". */
export function requesterLabel(by) {
  if (!by) return "";
  return by.startsWith("github:") ? `@${by.slice(7)}` : actorLabel(by);
}

/**
 * runRows is the run history as the task page draws it, newest first:
 * [{number, title, prompt, state, diff, cost, created, current}].
 */
export function runRows(task) {
  const runs = (task && Array.isArray(task.runs)) ? task.runs : [];
  const current = n(task && task.run) || 1;
  return runs.map((r) => {
    const by = requesterLabel(r.requested_by);
    return {
      number: n(r.number),
      title: `Run ${n(r.number)} · ${triggerLabel(r.trigger)}${by ? ` by ${by}` : ""}`,
      prompt: r.prompt || (n(r.number) === 1 ? task.prompt || "" : ""),
      state: r.state || "pending",
      diff: n(r.diff_stats && r.diff_stats.files_changed) > 0 ? formatDiff(r.diff_stats) : "",
      cost: formatCost(r.usage),
      created: r.create_time || "",
      current: n(r.number) === current,
    };
  }).sort((a, b) => b.number - a.number);
}

/** validateFollowUp mirrors FollowUpTask's checks and messages. */
export function validateFollowUp(prompt) {
  const p = (prompt || "").trim();
  if (p === "") return { prompt: "prompt: is required: say what the follow-up should change" };
  const bytes = new TextEncoder().encode(p).length;
  if (bytes > 32 << 10) return { prompt: `prompt: is ${bytes} bytes, more than the limit of ${32 << 10}` };
  return {};
}

/**
 * "$0.1234 of $5.00 in run 2" for the budget, which the model proxy
 * applies to each run (a follow-up starts afresh); "" without a budget.
 */
export function budgetText(task) {
  const b = task ? n(task.max_budget_usd) : 0;
  if (!(b > 0)) return "";
  const number = n(task.run) || 1;
  const runs = Array.isArray(task.runs) ? task.runs : [];
  const cur = runs.find((r) => n(r.number) === number);
  const spent = n(cur ? cur.usage && cur.usage.cost_usd : task.usage && task.usage.cost_usd);
  return `$${spent.toFixed(spent < 1 ? 4 : 2)} of $${b.toFixed(2)}${runs.length > 1 ? ` in run ${number}` : ""} (per run)`;
}

/** "$1.75 of $10.00 spent today · resets in 3 h" for the owner's daily quota ("" when none). */
export function quotaText(q, now) {
  if (!q || !(n(q.daily_usd) > 0)) return "";
  const spent = n(q.spent_today_usd);
  let text = `$${spent.toFixed(2)} of $${n(q.daily_usd).toFixed(2)} spent today`;
  if (spent >= n(q.daily_usd)) text += " (quota reached: new runs are refused)";
  const reset = q.resets_time ? new Date(q.resets_time).getTime() : NaN;
  if (!Number.isNaN(reset)) {
    const mins = Math.max(0, Math.ceil((reset - now) / 60000));
    text += ` · resets in ${mins < 60 ? `${mins} min` : `${Math.floor(mins / 60)} h ${mins % 60} min`}`;
  }
  return text;
}
