// The public REST API and the SSE stream, and nothing else. Same origin:
// the gateway serves both the API and this console.

/** An error answered by the API ({code, message, details}) or the network. */
export class ApiError extends Error {
  constructor(status, body, fallback) {
    const message = (body && typeof body.message === "string" && body.message) || fallback || `HTTP ${status}`;
    super(message);
    this.name = "ApiError";
    this.status = status; // HTTP status; 0 when the gateway could not be reached
    this.code = body && typeof body.code === "number" ? body.code : undefined;
    this.details = (body && Array.isArray(body.details)) ? body.details : [];
    this.field = fieldOf(body);
  }
}

/**
 * fieldOf names the request field a validation error is about: the
 * ErrorInfo metadata, else the BadRequest violation, else the message's
 * "field: …" prefix (validation messages start with the field name).
 */
export function fieldOf(body) {
  if (!body) return "";
  for (const d of Array.isArray(body.details) ? body.details : []) {
    if (d && d.metadata && typeof d.metadata.field === "string" && d.metadata.field) return d.metadata.field;
  }
  for (const d of Array.isArray(body.details) ? body.details : []) {
    const v = d && Array.isArray(d.field_violations) && d.field_violations[0];
    if (v && typeof v.field === "string" && v.field) return v.field;
  }
  const m = typeof body.message === "string" && /^([a-z][a-z0-9_]*): /.exec(body.message);
  return m ? m[1] : "";
}

/** A random Idempotency-Key (crypto.randomUUID needs a secure context). */
export function newRequestId() {
  if (globalThis.crypto && typeof crypto.randomUUID === "function") {
    try { return crypto.randomUUID(); } catch { /* not a secure context */ }
  }
  const b = new Uint8Array(16);
  crypto.getRandomValues(b);
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

const taskPath = (id) => `/v1/tasks/${encodeURIComponent(id)}`;

export class Api {
  /** @param {() => string} token returns the current bearer token */
  constructor(token) {
    this.token = token;
  }

  async request(method, path, { body, headers = {} } = {}) {
    const h = { Accept: "application/json", Authorization: `Bearer ${this.token()}`, ...headers };
    if (body !== undefined) h["Content-Type"] = "application/json";
    let res;
    try {
      res = await fetch(path, { method, headers: h, body: body === undefined ? undefined : JSON.stringify(body), cache: "no-store" });
    } catch (e) {
      throw new ApiError(0, null, `cannot reach the gateway (${e.message})`);
    }
    const text = await res.text();
    let json = null;
    try { json = text ? JSON.parse(text) : null; } catch { /* not JSON */ }
    if (!res.ok) throw new ApiError(res.status, json, text.trim().slice(0, 300) || res.statusText);
    return json;
  }

  listTasks({ pageSize = 50, pageToken = "", status = "", repo = "" } = {}) {
    const q = new URLSearchParams({ page_size: String(pageSize) });
    if (pageToken) q.set("page_token", pageToken);
    if (status) q.set("status", status);
    if (repo) q.set("repo", repo);
    return this.request("GET", `/v1/tasks?${q}`);
  }

  getTask(id) {
    return this.request("GET", taskPath(id)).then((r) => r.task);
  }

  createTask(req, requestId) {
    return this.request("POST", "/v1/tasks", { body: req, headers: { "Idempotency-Key": requestId } }).then((r) => r.task);
  }

  dispatchTask(id) {
    return this.request("POST", `${taskPath(id)}:dispatch`, { body: {} }).then((r) => r.task);
  }

  /** The task's trace as a waterfall (the console's own route, via Jaeger). */
  getTrace(id) {
    return this.request("GET", `/console/api/tasks/${encodeURIComponent(id)}/trace`);
  }

  cancelTask(id, reason) {
    return this.request("POST", `${taskPath(id)}:cancel`, { body: { reason } }).then((r) => r.task);
  }

  retryTask(id, requestId) {
    return this.request("POST", `${taskPath(id)}:retry`, { body: { request_id: requestId } }).then((r) => r.task);
  }

  /** A follow-up run; resolves to the whole answer: {task, run, created}. */
  followUpTask(id, prompt, requestId) {
    return this.request("POST", `${taskPath(id)}:followup`, { body: { prompt, request_id: requestId } });
  }

  /** The SSE URL; EventSource cannot set headers, hence access_token. */
  eventsURL(id) {
    return `${taskPath(id)}/events?access_token=${encodeURIComponent(this.token())}`;
  }
}
