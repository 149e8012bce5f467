// taskrunner console: views, routing (URL fragment: #/ and #/tasks/<id>)
// and the live task page. Untrusted text is only ever set with textContent.

import config from "./config.js";
import { Api, ApiError, newRequestId } from "./api.js";
import {
  TERMINAL, LIVE, STATE_TEXT, statusLabel, stageLabel, agentLabel, laterStage, outcomeOf, stageStates,
  formatDiff, formatUsage, formatTime, diffFromEvent, usageFromEvent, validateCreate,
} from "./model.js";

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = "taskrunner.token";
const LIST_REFRESH_MS = 5000;
const TASK_REFRESH_MS = 5000;
const LOG_LINES = config.logTailLines || 200;
const EVENT_NAMES = ["stage_change", "log", "diff_stats", "usage", "completed", "failed", "cancelled"];

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

function showTasks() {
  showView("tasks");
  document.title = "Tasks · taskrunner";
  let stopped = false;
  let timer = 0;
  let lastKey = "";
  let nextPageToken = "";
  let pages = 1;

  async function refresh() {
    clearTimeout(timer);
    if (stopped) return;
    $("list-status").textContent = "Refreshing…";
    try {
      // Re-read every page shown so far, so "Show more" survives refreshes.
      let tasks = [];
      let token = "";
      for (let i = 0; i < pages; i++) {
        const r = await api.listTasks({ pageSize: 50, pageToken: token });
        tasks = tasks.concat(r.tasks || []);
        token = r.next_page_token || "";
        if (!token) break;
      }
      if (stopped) return;
      nextPageToken = token;
      renderRows(tasks);
      $("list-status").textContent = `Updated ${new Date().toLocaleTimeString()}`;
    } catch (err) {
      if (stopped || handleAuthError(err)) return;
      $("list-status").textContent = `Could not load tasks: ${err.message}`;
    }
    if (!stopped) timer = setTimeout(refresh, LIST_REFRESH_MS);
  }

  function renderRows(tasks) {
    // Rebuild only when something changed, so focus and selection stay put.
    const key = JSON.stringify(tasks.map((t) => [t.id, t.status, t.stage, t.update_time]));
    $("list-empty").hidden = tasks.length > 0;
    $("list-more").hidden = !nextPageToken;
    if (key === lastKey) return;
    lastKey = key;
    const rows = tasks.map((t) => {
      const badge = el("span", { "data-testid": "status-badge" });
      setBadge(badge, t.status);
      const prompt = t.prompt.length > 90 ? `${t.prompt.slice(0, 90)}…` : t.prompt;
      return el("tr", { "data-testid": "task-row", "data-task-id": t.id, "data-status": t.status },
        el("td", {}, el("a", { href: `#/tasks/${encodeURIComponent(t.id)}`, "data-testid": "task-link", text: prompt || t.id })),
        el("td", { text: `${t.repo} @ ${t.base_branch}` }),
        el("td", {}, badge),
        el("td", { text: stageLabel(t.stage) || "—" }),
        el("td", { text: agentLabel(t.agent) }),
        el("td", {}, el("time", { datetime: t.create_time, text: formatTime(t.create_time) })));
    });
    $("task-rows").replaceChildren(...rows);
  }

  const onRefresh = () => refresh();
  const onMore = () => { pages++; refresh(); };
  const onVisible = () => { if (!document.hidden) refresh(); };
  $("list-refresh").addEventListener("click", onRefresh);
  $("list-more").addEventListener("click", onMore);
  document.addEventListener("visibilitychange", onVisible);
  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
    $("list-refresh").removeEventListener("click", onRefresh);
    $("list-more").removeEventListener("click", onMore);
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
  $("stage-announcer").textContent = "";

  // What the page shows: the task from REST, advanced by SSE events.
  const st = { task: null, stage: "", outcome: "idle", lastSeq: 0, terminalSeen: false, announced: "" };
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
    if (t.pr_url) {
      const link = externalLink(t.pr_url, t.pr_number && t.pr_number !== "0" ? `${t.repo}#${t.pr_number}` : t.pr_url, "pr-link");
      if (link.title !== undefined) link.title = t.pr_url;
      $("pr").replaceChildren(link);
    } else {
      $("pr").textContent = LIVE.has(t.status) ? "not opened yet" : "none";
    }
    if (t.trace_id && config.jaegerUrl) {
      $("trace").replaceChildren(externalLink(`${config.jaegerUrl}/trace/${encodeURIComponent(t.trace_id)}`, `View trace ${t.trace_id.slice(0, 16)} in Jaeger`, "trace-link"));
    } else {
      $("trace").textContent = t.trace_id ? `${t.trace_id} (no Jaeger URL configured)` : "no trace recorded";
    }
    $("retry-of-row").hidden = !t.retry_of;
    if (t.retry_of) $("retry-of").replaceChildren(el("a", { href: `#/tasks/${encodeURIComponent(t.retry_of)}`, text: t.retry_of }));
    $("task-created").replaceChildren(el("time", { datetime: t.create_time, text: formatTime(t.create_time) }));
    const reason = t.failed_reason || "";
    $("failed-reason").hidden = !reason;
    $("failed-reason").textContent = reason ? `${t.status === "TASK_STATUS_CANCELLED" ? "Cancelled" : "Failed"}: ${reason}` : "";
    $("cancel-button").hidden = TERMINAL.has(t.status);
    $("retry-button").hidden = !(t.status === "TASK_STATUS_FAILED" || t.status === "TASK_STATUS_CANCELLED");
    renderStages();
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

  /** Merge a task read over REST without undoing what SSE already showed. */
  function applyTask(t) {
    st.task = t;
    st.stage = laterStage(st.stage, t.stage);
    const o = outcomeOf(t);
    if (!(st.terminalSeen && o === "running")) st.outcome = o;
    render();
    // A task that stopped taking events (cancelled before it ran, reaped)
    // may never send a terminal event: give the stream a moment for any
    // last events, then close it instead of waiting for the server.
    if (!LIVE.has(t.status) && es && !graceTimer) graceTimer = setTimeout(() => closeStream("ended"), 3000);
  }

  function appendLog(lines, stage) {
    const box = $("log");
    const follow = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
    const prefix = stage ? `[${stageLabel(stage)}] ` : "";
    for (const line of lines) box.append(el("div", { class: "line", text: prefix + line }));
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
        if (t) t.usage = usageFromEvent(ev.usage);
        break;
      case "completed":
        st.terminalSeen = true;
        st.outcome = "completed";
        if (t) Object.assign(t, { status: "TASK_STATUS_AWAITING_REVIEW", pr_url: ev.completed.pr_url, pr_number: ev.completed.pr_number });
        break;
      case "failed":
        st.terminalSeen = true;
        st.outcome = "failed";
        if (t) Object.assign(t, { status: "TASK_STATUS_FAILED", failed_reason: ev.failed.reason || t.failed_reason, pr_url: ev.failed.pr_url || t.pr_url });
        break;
      case "cancelled":
        st.terminalSeen = true;
        st.outcome = "cancelled";
        if (t) Object.assign(t, { status: "TASK_STATUS_CANCELLED", failed_reason: ev.cancelled.reason || t.failed_reason });
        break;
    }
    render();
    if (st.terminalSeen) {
      closeStream("ended");
      load(); // the authoritative final state (trace id, PR number …)
    }
  }

  function setStreamState(state, text) {
    $("stream-state").dataset.state = state;
    $("stream-state").textContent = text;
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
    es.onopen = () => setStreamState("live", "live");
    es.onerror = () => {
      if (!es) return;
      if (es.readyState === EventSource.CLOSED) {
        // Refused (401, 404 …): EventSource gives up; polling carries on.
        es = null;
        setStreamState("unavailable", "live updates unavailable; refreshing every few seconds");
        load();
        return;
      }
      // The server ended the stream or the network dropped: EventSource
      // reconnects with Last-Event-ID unless the task has nothing more to say.
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
      if (!LIVE.has(t.status) && es && es.readyState !== EventSource.OPEN) closeStream("ended");
      if (!es && !st.terminalSeen && $("stream-state").dataset.state === "idle") openStream();
    } catch (err) {
      if (stopped || handleAuthError(err)) return;
      $("task-error").textContent = err.status === 404 ? `Task ${id} not found.` : `Could not load the task: ${err.message}`;
      if (err.status === 404) { closeStream(); return; }
    }
    // Poll while anything can still change: queued → running, and
    // awaiting_review → done (the merge webhook emits no event).
    if (!stopped && !TERMINAL.has(st.task ? st.task.status : "")) timer = setTimeout(load, TASK_REFRESH_MS);
  }

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

  const onCancel = () => act($("cancel-button"), "Cancelling", async () => {
    applyTask(await api.cancelTask(id, "cancelled from the console"));
    $("action-status").textContent = "Cancelled.";
  });
  const onRetry = () => act($("retry-button"), "Retrying", async () => {
    const t = await api.retryTask(id, newRequestId());
    navigate(`#/tasks/${encodeURIComponent(t.id)}`);
  });
  $("cancel-button").addEventListener("click", onCancel);
  $("retry-button").addEventListener("click", onRetry);

  // Reset what the previous task page left.
  setStreamState("idle", "");
  for (const li of document.querySelectorAll("#stages > li")) li.dataset.state = "pending";
  for (const tid of ["task-prompt", "task-repo", "task-agent", "diff-stats", "cost", "pr", "trace", "task-created", "failed-reason"]) $(tid).textContent = "";
  $("task-title").textContent = "Task";
  $("task-status").textContent = "";
  $("cancel-button").hidden = true;
  $("retry-button").hidden = true;
  // Every task's stream replays its whole history first, so finished tasks
  // show their log too.
  load();

  return () => {
    stopped = true;
    clearTimeout(timer);
    closeStream();
    $("cancel-button").removeEventListener("click", onCancel);
    $("retry-button").removeEventListener("click", onRetry);
  };
}

// ---------------------------------------------------------------- start

window.addEventListener("hashchange", route);
route();
