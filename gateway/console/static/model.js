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
