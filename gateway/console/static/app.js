// taskrunner console: views, routing (URL fragment: #/ and #/tasks/<id>)
// and the live task page. Untrusted text is only ever set with textContent.

import config from "./config.js";
import { Api, ApiError, newRequestId } from "./api.js";
import {
  TERMINAL, LIVE, STATE_TEXT, statusLabel, stageLabel, agentLabel, laterStage, outcomeOf, stageStates,
  formatDiff, formatUsage, formatTime, diffFromEvent, usageFromEvent, validateCreate,
  actionsFor, streamShowsLive, statusChangeText, sandboxText, queueText, relativePaths, stageCosts,
  formatDuration, waterfallBar, formatAge, formatCost, STATUS_FILTERS,
  runRows, validateFollowUp, budgetText, quotaText,
} from "./model.js";

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = "taskrunner.token";
const LIST_REFRESH_MS = 5000;
const TASK_REFRESH_MS = 5000;
const LOG_LINES = config.logTailLines || 200;
const EVENT_NAMES = ["stage_change", "log", "diff_stats", "usage", "completed", "failed", "cancelled",
  "status_change", "queue_position", "sandbox"];

// ---------------------------------------------------------------- session

const session = {
  get() {
    return sessionStorage.getItem(TOKEN_KEY) || localStorage.getItem(TOKEN_KEY) || "";
  },
  set(token, remember) {
    this.clear();
    (remember ? localStorage : sessionStorage).setItem(TOKEN_KEY, token);
  },
  clear() {
    sessionStorage.removeItem(TOKEN_KEY);
    localStorage.removeItem(TOKEN_KEY);
  },
};

const api = new Api(() => session.get());

// ---------------------------------------------------------------- helpers

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "text") e.textContent = v;
    else if (k === "class") e.className = v;
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) e.append(c);
  return e;
}

function setBadge(node, status) {
  node.textContent = statusLabel(status);
  node.className = `badge badge-${statusLabel(status).replace(/ /g, "-")}`;
  node.dataset.status = status || "";
}

/** A link that opens in a new tab, only for http(s) URLs. */
function externalLink(href, text, testid) {
  let ok = false;
  try { ok = ["http:", "https:"].includes(new URL(href, location.href).protocol); } catch { /* not a URL */ }
  if (!ok) return document.createTextNode(text);
  return el("a", { href, target: "_blank", rel: "noopener noreferrer", "data-testid": testid, text });
}

/** A 401 anywhere means the token is no good: back to sign-in. */
function handleAuthError(err) {
  if (err instanceof ApiError && err.status === 401) {
    session.clear();
    showSignin(`Signed out: ${err.message}`);
    return true;
  }
  return false;
}

// ---------------------------------------------------------------- routing

let cleanup = () => {};

function showView(name) {
  $("booting").hidden = true;
  for (const v of ["signin", "tasks", "task"]) $(`view-${v}`).hidden = v !== name;
  $("session").hidden = name === "signin";
}

function route() {
  cleanup();
  cleanup = () => {};
  if (!session.get()) {
    showSignin("");
    return;
  }
  const m = /^#\/tasks\/([^/?#]+)$/.exec(location.hash);
  if (m) {
    cleanup = showTask(decodeURIComponent(m[1]));
  } else {
    cleanup = showTasks();
  }
}

function navigate(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

// ---------------------------------------------------------------- sign in

function showSignin(message) {
  cleanup();
  cleanup = () => {};
  showView("signin");
  $("signin-token-error").textContent = message || "";
  $("signin-token").value = "";
  document.title = "Sign in · taskrunner";
  $("signin-token").focus();
}

$("signin-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const input = $("signin-token");
  const error = $("signin-token-error");
  const token = input.value.trim();
  input.removeAttribute("aria-invalid");
  error.textContent = "";
  if (!token) {
    error.textContent = "token: must not be empty";
    input.setAttribute("aria-invalid", "true");
    input.focus();
    return;
  }
  const button = ev.submitter || $("signin-form").querySelector("button[type=submit]");
  button.disabled = true;
  try {
    // Check the token with the cheapest authenticated call.
    await new Api(() => token).listTasks({ pageSize: 1 });
    session.set(token, $("signin-remember").checked);
    input.value = "";
    route();
  } catch (err) {
    error.textContent = err.status === 401 ? `token rejected: ${err.message}` : err.message;
    input.setAttribute("aria-invalid", "true");
    input.focus();
  } finally {
    button.disabled = false;
  }
});

$("signout").addEventListener("click", () => {
  session.clear();
  history.replaceState(null, "", "#/");
  showSignin("Signed out.");
});

document.querySelector("[data-skip]").addEventListener("click", (ev) => {
  ev.preventDefault(); // the fragment is the router's
  $("main").focus();
});

// ---------------------------------------------------------------- task list

const PAGE_SIZE = 20;
// Filters and page survive going to a task and back (not a reload).
const listState = { status: "", repo: "", tokens: [""] };

for (const f of STATUS_FILTERS) $("filter-status").append(el("option", { value: f, text: f.replace(/_/g, " ") }));

function showTasks() {
  showView("tasks");
  document.title = "Tasks · taskrunner";
  let stopped = false;
  let timer = 0;
  let lastKey = "";
  let nextPageToken = "";
  let tasks = [];
  $("filter-status").value = listState.status;
  $("filter-repo").value = listState.repo;

  async function refresh() {
    clearTimeout(timer);
    if (stopped) return;
    $("list-status").textContent = "Refreshing…";
    try {
      const r = await api.listTasks({ pageSize: PAGE_SIZE, pageToken: listState.tokens[listState.tokens.length - 1],
        status: listState.status, repo: listState.repo });
      if (stopped) return;
      nextPageToken = r.next_page_token || "";
      tasks = r.tasks || [];
      renderRows();
      $("list-status").textContent = `Updated ${new Date().toLocaleTimeString()}`;
    } catch (err) {
      if (stopped || handleAuthError(err)) return;
      $("list-status").textContent = `Could not load tasks: ${err.message}`;
    }
    if (!stopped) timer = setTimeout(refresh, LIST_REFRESH_MS);
  }

  function renderRows() {
    const filtered = !!(listState.status || listState.repo);
    $("list-empty").hidden = tasks.length > 0;
    $("list-empty").textContent = filtered ? "No tasks match these filters." : "No tasks yet. Create one above.";
    $("list-prev").disabled = listState.tokens.length <= 1;
    $("list-next").disabled = !nextPageToken;
    $("list-page").textContent = `Page ${listState.tokens.length}`;
    // Rebuild only when something changed, so focus and selection stay put
    // (the age column moves on by the minute).
    const now = Date.now();
    const key = JSON.stringify([tasks.map((t) => [t.id, t.status, t.stage, t.update_time]), Math.floor(now / 60000)]);
    if (key === lastKey) return;
    lastKey = key;
    const rows = tasks.map((t) => {
      const badge = el("span", { "data-testid": "status-badge" });
      setBadge(badge, t.status);
      const prompt = t.prompt.length > 90 ? `${t.prompt.slice(0, 90)}…` : t.prompt;
      const statusCell = el("td", {}, badge);
      const q = queueText(t.status, t.queue_position);
      if (q) statusCell.append(el("div", { class: "muted", "data-testid": "row-queue", text: q }));
      else if (t.stage && t.status === "TASK_STATUS_RUNNING") statusCell.append(el("div", { class: "muted", text: stageLabel(t.stage) }));
      const pr = t.pr_url ? externalLink(t.pr_url, t.pr_number && t.pr_number !== "0" ? `#${t.pr_number}` : "PR", "row-pr") : document.createTextNode("—");
      const reason = t.failed_reason ? (t.failed_reason.length > 120 ? `${t.failed_reason.slice(0, 120)}…` : t.failed_reason) : "";
      return el("tr", { "data-testid": "task-row", "data-task-id": t.id, "data-status": t.status, "data-repo": t.repo },
        statusCell,
        el("td", {}, el("a", { href: `#/tasks/${encodeURIComponent(t.id)}`, "data-testid": "task-link", text: prompt || t.id })),
        el("td", { text: `${t.repo} @ ${t.base_branch}`, "data-testid": "row-repo" }),
        el("td", {}, pr),
        el("td", { class: "cost", "data-testid": "row-cost", text: formatCost(t.usage) }),
        el("td", { class: "reason", "data-testid": "row-reason", text: reason, title: t.failed_reason || undefined }),
        el("td", { class: "age" }, el("time", { datetime: t.create_time, title: formatTime(t.create_time), text: formatAge(t.create_time, now) })));
    });
    $("task-rows").replaceChildren(...rows);
  }

  const onFilter = (ev) => {
    ev.preventDefault();
    listState.status = $("filter-status").value;
    listState.repo = $("filter-repo").value.trim();
    listState.tokens = [""];
    lastKey = "";
    refresh();
  };
  const onClear = () => {
    $("filter-status").value = "";
    $("filter-repo").value = "";
    $("list-filters").requestSubmit();
  };
  const onRefresh = () => refresh();
  const onNext = () => { if (nextPageToken) { listState.tokens.push(nextPageToken); refresh(); } };
  const onPrev = () => { if (listState.tokens.length > 1) { listState.tokens.pop(); refresh(); } };
  const onVisible = () => { if (!document.hidden) refresh(); };
  $("list-filters").addEventListener("submit", onFilter);
  $("filter-clear").addEventListener("click", onClear);
  $("list-refresh").addEventListener("click", onRefresh);
  $("list-next").addEventListener("click", onNext);
  $("list-prev").addEventListener("click", onPrev);
  document.addEventListener("visibilitychange", onVisible);
  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
    $("list-filters").removeEventListener("submit", onFilter);
    $("filter-clear").removeEventListener("click", onClear);
    $("list-refresh").removeEventListener("click", onRefresh);
    $("list-next").removeEventListener("click", onNext);
    $("list-prev").removeEventListener("click", onPrev);
    document.removeEventListener("visibilitychange", onVisible);
  };
}

// ---------------------------------------------------------------- create form

const FIELDS = { repo: "create-repo", base_branch: "create-base-branch", prompt: "create-prompt", agent: "create-agent" };
let pendingCreate = { body: "", requestId: "" }; // reuse the key when the same request is resubmitted after a failure

function clearFormErrors() {
  $("create-error").textContent = "";
  for (const [field, id] of Object.entries(FIELDS)) {
    $(`error-${field}`).textContent = "";
    $(id).removeAttribute("aria-invalid");
  }
}

function showFieldErrors(errors) {
  let first = null;
  for (const field of ["repo", "base_branch", "agent", "prompt"]) {
    if (!errors[field]) continue;
    $(`error-${field}`).textContent = errors[field];
    $(FIELDS[field]).setAttribute("aria-invalid", "true");
    first = first || $(FIELDS[field]);
  }
  if (first) first.focus();
}

$("create-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  clearFormErrors();
  const req = {
    repo: $("create-repo").value.trim(),
    base_branch: $("create-base-branch").value.trim(),
    prompt: $("create-prompt").value,
    agent: $("create-agent").value,
    dispatch: $("create-dispatch").checked,
  };
  const errors = validateCreate(req);
  if (Object.keys(errors).length) {
    showFieldErrors(errors);
    return;
  }
  const body = JSON.stringify(req);
  if (pendingCreate.body !== body) pendingCreate = { body, requestId: newRequestId() };
  const button = $("create-form").querySelector("button[type=submit]");
  button.disabled = true;
  $("create-form").setAttribute("aria-busy", "true");
  try {
    const task = await api.createTask(req, pendingCreate.requestId);
    pendingCreate = { body: "", requestId: "" };
    $("create-prompt").value = "";
    navigate(`#/tasks/${encodeURIComponent(task.id)}`);
  } catch (err) {
    if (handleAuthError(err)) return;
    if (err.status === 400 && FIELDS[err.field]) showFieldErrors({ [err.field]: err.message });
    else $("create-error").textContent = err.message;
  } finally {
    button.disabled = false;
    $("create-form").removeAttribute("aria-busy");
  }
});

// ---------------------------------------------------------------- task page

function showTask(id) {
  showView("task");
  document.title = "Task · taskrunner";
  $("task-error").textContent = "";
  $("action-status").textContent = "";
  $("log").replaceChildren();
  $("timeline").replaceChildren();
  $("timeline-empty").hidden = false;
  $("waterfall").replaceChildren();
  $("stage-costs").replaceChildren();
  $("stage-costs-empty").hidden = false;
  $("trace-state").textContent = "";
  $("stage-announcer").textContent = "";

  // What the page shows: the task from REST, advanced by SSE events.
  // costEvents: stage boundaries and cumulative usage, for the cost chart.
  const st = { task: null, stage: "", outcome: "idle", lastSeq: 0, terminalSeen: false, announced: "", costEvents: [], traceFor: "", runsKey: "" };
  let pendingFollowUp = { prompt: "", requestId: "" }; // the same key when the same follow-up is resent after a failure
  let stopped = false;
  let es = null;
  let timer = 0;
  let graceTimer = 0;

  function render() {
    const t = st.task;
    if (!t) return;
    $("task-title").textContent = `Task ${t.id.slice(0, 8)}`;
    $("task-title").title = t.id;
    setBadge($("task-status"), t.status);
    $("task-prompt").textContent = t.prompt;
    $("task-repo").textContent = `${t.repo} @ ${t.base_branch}` + (t.head_branch ? ` → ${t.head_branch}` : "");
    $("task-agent").textContent = agentLabel(t.agent);
    $("diff-stats").textContent = formatDiff(t.diff_stats) || "—";
    $("cost").textContent = formatUsage(t.usage) || "—";
    const budget = budgetText(t);
    $("budget-row").hidden = !budget;
    $("budget").textContent = budget;
    const quota = quotaText(t.owner_quota, Date.now());
    $("quota-row").hidden = !quota;
    $("owner-quota").textContent = quota;
    if (t.pr_url) {
      const link = externalLink(t.pr_url, t.pr_number && t.pr_number !== "0" ? `${t.repo}#${t.pr_number}` : t.pr_url, "pr-link");
      if (link.title !== undefined) link.title = t.pr_url;
      $("pr").replaceChildren(link);
    } else {
      $("pr").textContent = TERMINAL.has(t.status) ? "none" : "not opened yet";
    }
    if (t.trace_id && config.jaegerUrl) {
      $("trace").replaceChildren(externalLink(`${config.jaegerUrl}/trace/${encodeURIComponent(t.trace_id)}`, `View trace ${t.trace_id.slice(0, 16)} in Jaeger`, "trace-link"));
    } else {
      $("trace").textContent = t.trace_id ? `${t.trace_id} (no Jaeger URL configured)` : "no trace recorded";
    }
    $("retry-of-row").hidden = !t.retry_of;
    if (t.retry_of) $("retry-of").replaceChildren(el("a", { href: `#/tasks/${encodeURIComponent(t.retry_of)}`, text: t.retry_of }));
    $("task-created").replaceChildren(el("time", { datetime: t.create_time, text: formatTime(t.create_time) }));
    const q = queueText(t.status, t.queue_position);
    $("queue-row").hidden = !q;
    $("queue-position").textContent = q;
    const reason = t.failed_reason || "";
    $("failed-reason").hidden = !reason || !TERMINAL.has(t.status);
    $("failed-reason").textContent = reason ? `${t.status === "TASK_STATUS_CANCELLED" ? "Cancelled" : "Failed"}: ${reason}` : "";
    const can = actionsFor(t);
    $("dispatch-button").hidden = !can.dispatch;
    $("cancel-button").hidden = !can.cancel;
    $("retry-button").hidden = !can.retry;
    // Say what the click does before it is made.
    const prName = t.pr_number && t.pr_number !== "0" ? `pull request #${t.pr_number}` : "the pull request";
    $("cancel-warning").hidden = !can.cancelClosesPR;
    $("cancel-warning").textContent = can.cancelClosesPR ? `Cancelling this task closes its open ${prName} without merging it.` : "";
    $("cancel-button").textContent = can.cancelClosesPR ? "Cancel task and close PR" : "Cancel task";
    if (es && $("stream-state").dataset.state !== "reconnecting") showStreamOpen();
    renderRuns(can.followUp);
    renderStages();
    renderCosts();
  }

  /** The run history (newest first) and, where a follow-up applies, its box. */
  function renderRuns(canFollowUp) {
    const rows = runRows(st.task);
    const wasHidden = $("followup-form").hidden;
    $("followup-form").hidden = !canFollowUp;
    $("runs-card").hidden = !canFollowUp && rows.length < 2;
    if (wasHidden && canFollowUp) $("followup-error").textContent = "";
    const key = JSON.stringify(rows);
    if (key === st.runsKey) return;
    st.runsKey = key;
    $("runs").replaceChildren(...rows.map((r) => {
      const facts = [r.diff, r.cost !== "—" ? r.cost : ""].filter(Boolean).join(" · ");
      const head = el("div", { class: "run-head" },
        el("span", { class: "run-title", "data-testid": "run-title", text: r.title }),
        el("span", { class: `badge badge-run-${r.state}`, "data-testid": "run-state", text: r.state }),
        el("span", { class: "muted", "data-testid": "run-facts", text: facts }),
        r.created ? el("time", { class: "muted", datetime: r.created, text: formatTime(r.created) }) : el("span"));
      const li = el("li", { "data-testid": "run-row", "data-run": r.number, "data-state": r.state, "data-current": r.current ? "true" : "false" }, head);
      if (r.prompt) li.append(el("p", { class: "run-prompt", "data-testid": "run-prompt", text: r.prompt }));
      return li;
    }));
  }

  function renderStages() {
    const states = stageStates(st.stage, st.outcome);
    document.querySelectorAll("#stages > li").forEach((li, i) => {
      if (li.dataset.state !== states[i]) li.dataset.state = states[i];
      li.querySelector(".stage-state").textContent = STATE_TEXT[states[i]];
      if (states[i] === "active") li.setAttribute("aria-current", "step");
      else li.removeAttribute("aria-current");
    });
    const msg = st.outcome === "completed" ? "All four stages done."
      : st.stage && st.outcome === "running" ? `Stage ${stageLabel(st.stage)} in progress.` : "";
    if (msg && msg !== st.announced) $("stage-announcer").textContent = st.announced = msg;
  }

  function renderCosts() {
    const costs = stageCosts(st.costEvents);
    $("stage-costs-empty").hidden = costs.length > 0;
    const max = Math.max(1e-9, ...costs.map((c) => c.cost));
    // With follow-ups, name each stage's run: "run 2 · propose".
    const runs = new Set(costs.map((c) => c.run)).size;
    $("stage-costs").replaceChildren(...costs.map((c) => {
      const bar = el("div", { class: "cost-bar" });
      bar.style.width = `${((c.cost / max) * 100).toFixed(1)}%`;
      return el("div", { class: "cost-row", role: "row", "data-testid": "stage-cost", "data-stage": stageLabel(c.stage) },
        el("span", { role: "rowheader", text: runs > 1 ? `run ${c.run} · ${stageLabel(c.stage)}` : stageLabel(c.stage) }),
        el("div", { class: "cost-track", role: "cell", "aria-hidden": "true" }, bar),
        el("span", { class: "cost-value", role: "cell", text: `$${c.cost.toFixed(4)}` }));
    }));
  }

  function addTimeline(type, ev, text, actor) {
    $("timeline-empty").hidden = true;
    const time = ev.time ? el("time", { datetime: ev.time, title: formatTime(ev.time), text: new Date(ev.time).toLocaleTimeString() }) : el("time", { text: "" });
    const body = el("span", { text });
    $("timeline").append(el("li", { "data-testid": "timeline-item", "data-type": type, "data-actor": actor || undefined }, time, body));
  }

  /** Merge a task read over REST without undoing what SSE already showed. */
  function applyTask(t) {
    st.task = t;
    st.stage = laterStage(st.stage, t.stage);
    const o = outcomeOf(t);
    if (!(st.terminalSeen && o === "running")) st.outcome = o;
    render();
    // A task that ended without a final status_change on its timeline (one
    // written before status_change existed): give the stream a moment for
    // any last events, then close it instead of waiting for the server.
    if (TERMINAL.has(t.status) && es && !graceTimer) graceTimer = setTimeout(() => closeStream("ended"), 3000);
    maybeLoadTrace();
  }

  function appendLog(lines, stage) {
    const box = $("log");
    const follow = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
    const prefix = stage ? `[${stageLabel(stage)}] ` : "";
    for (const line of lines) box.append(el("div", { class: "line", text: prefix + relativePaths(line) }));
    while (box.childElementCount > LOG_LINES) box.firstElementChild.remove();
    if (follow) box.scrollTop = box.scrollHeight;
  }

  function onEvent(name, ev) {
    const seq = Number(ev.seq || 0);
    if (seq && seq <= st.lastSeq) return; // EventSource may resend after a reconnect
    if (seq) st.lastSeq = seq;
    const t = st.task;
    switch (name) {
      case "stage_change":
        st.stage = laterStage(st.stage, ev.stage_change.stage);
        st.costEvents.push({ type: "stage", stage: ev.stage_change.stage, run: ev.run });
        if (st.outcome === "idle") st.outcome = "running";
        // A replay of a finished task must not make it look running again.
        if (t && LIVE.has(t.status)) Object.assign(t, { status: "TASK_STATUS_RUNNING", stage: st.stage });
        break;
      case "log":
        appendLog(ev.log.lines || [], ev.log.stage);
        return;
      case "diff_stats":
        if (t) t.diff_stats = diffFromEvent(ev.diff_stats);
        break;
      case "usage":
        st.costEvents.push({ type: "usage", cost: ev.usage.cost_usd });
        if (t) t.usage = usageFromEvent(ev.usage);
        break;
      case "completed":
        // The runner is done; the task awaits review and its stream stays
        // open until the final status_change.
        st.outcome = "completed";
        if (t && !TERMINAL.has(t.status)) Object.assign(t, { status: "TASK_STATUS_AWAITING_REVIEW", pr_url: ev.completed.pr_url, pr_number: ev.completed.pr_number });
        break;
      case "failed":
        st.outcome = "failed";
        if (t) Object.assign(t, { failed_reason: ev.failed.reason || t.failed_reason, pr_url: ev.failed.pr_url || t.pr_url });
        break;
      case "cancelled":
        st.outcome = "cancelled";
        if (t) Object.assign(t, { failed_reason: ev.cancelled.reason || t.failed_reason });
        break;
      case "status_change": {
        const sc = ev.status_change;
        addTimeline("status_change", ev, statusChangeText(sc), sc.actor);
        if (t) {
          t.status = sc.to;
          t.queue_position = sc.to === "TASK_STATUS_QUEUED" ? sc.queue_position : "0";
          if ((sc.to === "TASK_STATUS_FAILED" || sc.to === "TASK_STATUS_CANCELLED") && sc.reason) t.failed_reason = sc.reason;
        }
        if (TERMINAL.has(sc.to)) {
          st.terminalSeen = true;
          if (!(sc.to === "TASK_STATUS_CANCELLED" && st.outcome === "completed")) st.outcome = outcomeOf({ status: sc.to, pr_url: t && t.pr_url });
        } else if (sc.to === "TASK_STATUS_RUNNING" && st.outcome === "idle") {
          st.outcome = "running";
        }
        break;
      }
      case "queue_position":
        addTimeline("queue_position", ev, `now ${queueText("TASK_STATUS_QUEUED", ev.queue_position.position)}`);
        if (t && t.status === "TASK_STATUS_QUEUED") t.queue_position = ev.queue_position.position;
        break;
      case "sandbox":
        addTimeline("sandbox", ev, sandboxText(ev.sandbox));
        break;
    }
    render();
    if (st.terminalSeen) {
      closeStream("ended");
      load(); // the authoritative final state (trace id, PR number …)
    } else if (name === "status_change") {
      load(); // a run started or ended: its row (state, diff, cost) comes from REST
    }
  }

  function setStreamState(state, text) {
    $("stream-state").dataset.state = state;
    $("stream-state").textContent = text;
  }

  /** An open stream is "● live" only once the task runs. */
  function showStreamOpen() {
    const s = st.task ? st.task.status : "";
    if (streamShowsLive(s)) setStreamState("live", "live");
    else setStreamState("waiting", s === "TASK_STATUS_QUEUED" ? "waiting for capacity" : "not started");
  }

  function closeStream(state) {
    clearTimeout(graceTimer);
    if (es) { es.close(); es = null; }
    if (state === "ended") setStreamState("ended", "stream ended");
  }

  function openStream() {
    if (es || stopped) return;
    es = new EventSource(api.eventsURL(id));
    setStreamState("connecting", "connecting…");
    for (const name of EVENT_NAMES) {
      es.addEventListener(name, (e) => {
        let data;
        try { data = JSON.parse(e.data); } catch { return; }
        onEvent(name, data);
      });
    }
    es.onopen = () => showStreamOpen();
    es.onerror = () => {
      if (!es) return;
      if (es.readyState === EventSource.CLOSED) {
        // 204 after the final event, or refused (401, 404 …): EventSource
        // gives up; polling carries on.
        es = null;
        if (st.task && TERMINAL.has(st.task.status)) setStreamState("ended", "stream ended");
        else setStreamState("unavailable", "live updates unavailable; refreshing every few seconds");
        load();
        return;
      }
      // The network dropped: EventSource reconnects with Last-Event-ID.
      setStreamState("reconnecting", "reconnecting…");
      load();
    };
  }

  async function load() {
    clearTimeout(timer);
    if (stopped) return;
    try {
      const t = await api.getTask(id);
      if (stopped) return;
      applyTask(t);
      $("task-error").textContent = "";
      if (TERMINAL.has(t.status) && es && es.readyState !== EventSource.OPEN) closeStream("ended");
      if (!es && !st.terminalSeen && $("stream-state").dataset.state === "idle") openStream();
    } catch (err) {
      if (stopped || handleAuthError(err)) return;
      $("task-error").textContent = err.status === 404 ? `Task ${id} not found.` : `Could not load the task: ${err.message}`;
      if (err.status === 404) { closeStream(); return; }
    }
    if (!stopped && !TERMINAL.has(st.task ? st.task.status : "")) timer = setTimeout(load, TASK_REFRESH_MS);
  }

  // ------------------------------------------------------------ trace

  /** Load the waterfall once the runner is done (its spans are exported by then). */
  function maybeLoadTrace() {
    const t = st.task;
    if (!t || !config.traceApi || !t.trace_id) {
      $("trace-card").hidden = !t || !config.traceApi;
      return;
    }
    $("trace-card").hidden = false;
    const key = `${t.status}`;
    if (st.traceFor === key || LIVE.has(t.status)) return;
    st.traceFor = key;
    loadTrace();
  }

  async function loadTrace() {
    $("trace-state").textContent = "Loading…";
    try {
      const wf = await api.getTrace(id);
      if (stopped) return;
      renderWaterfall(wf);
      const errors = wf.spans.filter((s) => s.error).length;
      $("trace-state").textContent = `${wf.spans.length} spans, ${formatDuration(wf.duration_us)}${errors ? `, ${errors} with errors` : ""}`;
    } catch (err) {
      if (stopped || handleAuthError(err)) return;
      $("trace-state").textContent = `Trace unavailable: ${err.message}`;
    }
  }

  function renderWaterfall(wf) {
    const rows = wf.spans.map((s) => {
      const bar = el("div", { class: "span-bar" });
      const b = waterfallBar(s, wf.duration_us);
      bar.style.left = `${b.left}%`;
      bar.style.width = `${b.width}%`;
      const label = el("div", { class: "span-label", role: "cell",
        title: `${s.service} ${s.name}${s.error_message ? ` — ${s.error_message}` : ""}` },
      el("span", { class: "span-service", text: s.service }), el("span", { class: "span-name", text: s.name }));
      label.style.paddingLeft = `${Math.min(s.depth, 12) * 0.9}rem`;
      if (s.cost_usd !== undefined) label.append(el("span", { class: "muted", text: ` $${Number(s.cost_usd).toFixed(4)}` }));
      if (s.error) label.append(el("span", { class: "muted", text: ` ✕ ${s.error_message || "error"}` }));
      return el("div", { class: "span-row", role: "row", "data-testid": "span-row", "data-name": s.name, "data-service": s.service,
        "data-error": s.error ? "true" : "false" },
      label, el("div", { class: "span-track", role: "cell", "aria-hidden": "true" }, bar),
      el("div", { class: "span-dur", role: "cell", text: formatDuration(s.duration_us) }));
    });
    $("waterfall").replaceChildren(...rows);
  }

  // ------------------------------------------------------------ actions

  async function act(button, what, fn) {
    button.disabled = true;
    $("action-status").textContent = `${what}…`;
    try {
      await fn();
    } catch (err) {
      if (!handleAuthError(err)) $("action-status").textContent = `${what} failed: ${err.message}`;
      return;
    } finally {
      button.disabled = false;
    }
  }

  const onDispatch = () => act($("dispatch-button"), "Dispatching", async () => {
    const t = await api.dispatchTask(id);
    applyTask(t);
    $("action-status").textContent = t.status === "TASK_STATUS_QUEUED" ? "Dispatched: queued." : "Dispatched.";
    if (!es && !st.terminalSeen) openStream();
    load();
  });
  const onCancel = () => act($("cancel-button"), "Cancelling", async () => {
    applyTask(await api.cancelTask(id, "cancelled from the console"));
    $("action-status").textContent = "Cancelled.";
  });
  const onRetry = () => act($("retry-button"), "Retrying", async () => {
    const t = await api.retryTask(id, newRequestId());
    navigate(`#/tasks/${encodeURIComponent(t.id)}`);
  });
  const onFollowUp = async (ev) => {
    ev.preventDefault();
    const input = $("followup-prompt");
    const error = $("followup-error");
    error.textContent = "";
    input.removeAttribute("aria-invalid");
    const errors = validateFollowUp(input.value);
    if (errors.prompt) {
      error.textContent = errors.prompt;
      input.setAttribute("aria-invalid", "true");
      input.focus();
      return;
    }
    const prompt = input.value.trim();
    if (pendingFollowUp.prompt !== prompt) pendingFollowUp = { prompt, requestId: newRequestId() };
    const button = $("followup-form").querySelector("button[type=submit]");
    button.disabled = true;
    $("followup-status").textContent = "Sending…";
    try {
      const r = await api.followUpTask(id, prompt, pendingFollowUp.requestId);
      pendingFollowUp = { prompt: "", requestId: "" };
      input.value = "";
      const run = r.run || {};
      $("followup-status").textContent = `Run ${run.number || ""} ${run.state === "pending" ? "waits behind the active run" : "started"}.`;
      // A follow-up run streams on the same timeline: follow it live again.
      st.terminalSeen = false;
      if (r.task) applyTask(r.task);
      if (!es) openStream();
      load();
    } catch (err) {
      if (handleAuthError(err)) return;
      $("followup-status").textContent = "";
      error.textContent = err.message;
      input.setAttribute("aria-invalid", "true");
    } finally {
      button.disabled = false;
    }
  };
  const onTrace = () => loadTrace();
  $("followup-form").addEventListener("submit", onFollowUp);
  $("dispatch-button").addEventListener("click", onDispatch);
  $("cancel-button").addEventListener("click", onCancel);
  $("retry-button").addEventListener("click", onRetry);
  $("trace-refresh").addEventListener("click", onTrace);

  // Reset what the previous task page left.
  setStreamState("idle", "");
  for (const li of document.querySelectorAll("#stages > li")) li.dataset.state = "pending";
  for (const tid of ["task-prompt", "task-repo", "task-agent", "diff-stats", "cost", "pr", "trace", "task-created", "failed-reason", "cancel-warning"]) $(tid).textContent = "";
  $("task-title").textContent = "Task";
  $("task-status").textContent = "";
  for (const b of ["dispatch-button", "cancel-button", "retry-button", "cancel-warning", "queue-row", "budget-row", "quota-row", "runs-card", "followup-form"]) $(b).hidden = true;
  $("runs").replaceChildren();
  $("followup-prompt").value = "";
  $("followup-error").textContent = "";
  $("followup-status").textContent = "";
  $("trace-card").hidden = true;
  // Every task's stream replays its whole history first, so finished tasks
  // show their log and timeline too.
  load();

  return () => {
    stopped = true;
    clearTimeout(timer);
    closeStream();
    $("dispatch-button").removeEventListener("click", onDispatch);
    $("cancel-button").removeEventListener("click", onCancel);
    $("retry-button").removeEventListener("click", onRetry);
    $("trace-refresh").removeEventListener("click", onTrace);
    $("followup-form").removeEventListener("submit", onFollowUp);
  };
}

// ---------------------------------------------------------------- start

window.addEventListener("hashchange", route);
route();
