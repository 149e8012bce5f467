#!/usr/bin/env node
// Browser tests of the web console: headless Debian Chromium driven by
// playwright-core (which never downloads a browser).
//
//   BASE_URL=http://127.0.0.1:8080 TOKEN=$(cat .dev/token) OUT_DIR=.dev/browsertest \
//     node tools/browsertest/console.mjs
//
// Scenarios:
//   create-task  sign in, create and dispatch a task (demo/greet, "Add a
//                --farewell flag to greet"), watch the four stages complete
//                live on the task page, in order, see the PR link; screenshot.
//   validation   submit an empty prompt and see "prompt: must not be empty"
//                next to the prompt field (client-side, no request sent);
//                then a bad base branch, whose message comes from the API's
//                400 answer; screenshot.
//
// Environment:
//   BASE_URL      the gateway serving the console and the API (required)
//   TOKEN         an API token (or TOKEN_FILE, a file holding one)
//   OUT_DIR       where artifacts go (default ./browsertest-artifacts)
//   CHROMIUM      the browser (default /usr/bin/chromium)
//   REPO          repository of the task (default demo/greet)
//   PROMPT        prompt of the task (default "Add a --farewell flag to greet")
//   TASK_TIMEOUT_MS  how long the task may take to open its PR (default 240000)
//   SCENARIOS     comma-separated subset (default create-task,validation,daily-work,queue,trace,
//                 and cors when CORS_PAGE is set)
//   DEMO_TASK_ID  the awaiting-review task that trace and cancel-review use
//                 (default: the one create-task created in this run)
//   RESULT_FILE   name of the result file in OUT_DIR (default result.json), so
//                 a second run into the same OUT_DIR keeps the first's
//   CORS_PAGE     cors.html served from an origin the gateway allows
//                 (TASKRUNNER_CORS_ORIGINS); CORS_DENIED_PAGE the same page
//                 from an origin it does not allow (browsertest.CrossOrigin)
//
//   daily-work   list columns and filters (status, repository), create a task
//                without dispatching it: no live marker while it is proposing,
//                Dispatch from its page; it runs or queues; cancel it.
//   queue        dispatch tasks of one repository until one is queued (the
//                per-repository limit), see its queue position on its page
//                and in the list, then cancel them all.
//   trace        the demo task's trace waterfall (spans from the gateway to
//                the runner's stages, read from Jaeger) and cost per stage.
//   cors         a page of another origin calls the API (a list, a preflighted
//                POST whose 400 it can read, the exposed X-Request-Id) and
//                opens a task's event stream; the same page from an origin
//                the gateway does not allow can do neither.
//   cancel-review (not in the default set: it closes the demo task's PR)
//                the awaiting-review demo task warns, before the click, that
//                Cancel closes its pull request, by the number the API gives
//                ("Cancelling this task closes its open pull request #N …");
//                screenshot; cancel it from its page; the warning goes, the
//                timeline shows the cancel and the stream ends.
//
// Artifacts in OUT_DIR: console-task.png, console-validation.png,
// console-list.png, console-queue.png, console-trace.png, console-cancel-review.png, console-cors.png,
// failure-<scenario>.png (on failure), result.json (what happened; RESULT_FILE).
// Exit status: 0 when every scenario passed, 1 when one failed, 2 on bad usage.

import { mkdir, readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { chromium } from "playwright-core";

const STAGES = ["explore", "propose", "apply", "archive"];

function usage(msg) {
  console.error(`browsertest: ${msg}`);
  console.error("usage: BASE_URL=http://127.0.0.1:8080 TOKEN=trt_… [OUT_DIR=dir] node tools/browsertest/console.mjs");
  process.exit(2);
}

async function config() {
  const env = process.env;
  if (!env.BASE_URL) usage("BASE_URL is required (the gateway that serves the console)");
  let base;
  try { base = new URL(env.BASE_URL); } catch { usage(`BASE_URL: not a URL: ${JSON.stringify(env.BASE_URL)}`); }
  let token = env.TOKEN || "";
  if (!token && env.TOKEN_FILE) token = (await readFile(env.TOKEN_FILE, "utf8")).trim();
  if (!token) usage("TOKEN (or TOKEN_FILE) is required");
  const defaults = "create-task,validation,daily-work,queue,trace" + (env.CORS_PAGE ? ",cors" : "");
  const scenarios = (env.SCENARIOS || defaults).split(",").map((s) => s.trim()).filter(Boolean);
  for (const s of scenarios) if (!SCENARIOS[s]) usage(`SCENARIOS: unknown scenario ${JSON.stringify(s)} (have ${Object.keys(SCENARIOS).join(", ")})`);
  if (scenarios.includes("cors") && !(env.CORS_PAGE && env.CORS_DENIED_PAGE)) usage("the cors scenario needs CORS_PAGE and CORS_DENIED_PAGE");
  if (env.RESULT_FILE && (path.basename(env.RESULT_FILE) !== env.RESULT_FILE || !env.RESULT_FILE.endsWith(".json"))) usage(`RESULT_FILE: want a file name ending in .json, not a path: ${JSON.stringify(env.RESULT_FILE)}`);
  const timeout = Number(env.TASK_TIMEOUT_MS || 240000);
  if (!(timeout > 0)) usage("TASK_TIMEOUT_MS: want a positive number of milliseconds");
  return {
    base: base.href.replace(/\/$/, ""),
    token,
    outDir: path.resolve(env.OUT_DIR || "browsertest-artifacts"),
    chromium: env.CHROMIUM || "/usr/bin/chromium",
    repo: env.REPO || "demo/greet",
    prompt: env.PROMPT || "Add a --farewell flag to greet",
    taskTimeout: timeout,
    scenarios,
    demoTask: env.DEMO_TASK_ID || "",
    resultFile: env.RESULT_FILE || "result.json",
    corsPage: env.CORS_PAGE || "",
    corsDeniedPage: env.CORS_DENIED_PAGE || "",
  };
}

class Failure extends Error {}
function check(cond, msg) {
  if (!cond) throw new Failure(msg);
}

/** Waits for a locator, turning Playwright's timeout into a readable failure. */
async function waitFor(locator, what, timeout, state = "visible") {
  try {
    await locator.waitFor({ state, timeout });
  } catch (e) {
    throw new Failure(`timed out after ${timeout} ms waiting for ${what}`);
  }
}

const tid = (page, id) => page.getByTestId(id);

async function signIn(page, cfg) {
  await page.goto(`${cfg.base}/`, { waitUntil: "domcontentloaded" });
  await waitFor(tid(page, "signin-form"), "the sign-in form", 15000);
  check(await tid(page, "nav-tasks").isHidden() && await tid(page, "signout").isHidden(), "the sign-in page shows the Tasks / Sign out links");
  await tid(page, "signin-token").fill(cfg.token);
  await tid(page, "signin-submit").click();
  const outcome = await Promise.race([
    tid(page, "view-tasks").waitFor({ state: "visible", timeout: 15000 }).then(() => "ok"),
    page.waitForFunction(() => document.querySelector("[data-testid=signin-error]")?.textContent.trim(), null, { timeout: 15000 })
      .then(() => "error"),
  ]).catch(() => "timeout");
  if (outcome === "error") throw new Failure(`sign-in refused: ${await tid(page, "signin-error").textContent()}`);
  check(outcome === "ok", "sign-in did not show the task list within 15 s");
}

// Records every data-state change of the stage steps, from before the
// console's own scripts run, so the order can be checked afterwards.
function recordStages() {
  window.__stageLog = [];
  new MutationObserver((records) => {
    for (const r of records) {
      const el = r.target;
      const id = el.getAttribute && el.getAttribute("data-testid");
      if (id && id.startsWith("stage-") && id !== "stage-progress") {
        window.__stageLog.push({ stage: id.slice(6), state: el.getAttribute("data-state"), t: performance.now() });
      }
    }
  }).observe(document, { subtree: true, attributes: true, attributeFilter: ["data-state"] });
}

const SCENARIOS = {
  async "create-task"(page, cfg, result) {
    await page.addInitScript(recordStages);
    await signIn(page, cfg);
    await tid(page, "create-repo").fill(cfg.repo);
    await tid(page, "create-base-branch").fill("main");
    await tid(page, "create-prompt").fill(cfg.prompt);
    await tid(page, "create-agent").selectOption("AGENT_CLAUDE");
    await tid(page, "create-dispatch").check();
    await tid(page, "create-submit").click();
    try {
      await page.waitForURL(/#\/tasks\/[0-9a-f-]{36}$/, { timeout: 15000 });
    } catch {
      const err = [await tid(page, "create-error").textContent(), await tid(page, "error-repo").textContent(),
        await tid(page, "error-prompt").textContent()].filter((s) => s && s.trim()).join("; ");
      throw new Failure(`creating the task did not open its page within 15 s${err ? `: ${err}` : ""}`);
    }
    const taskId = page.url().split("#/tasks/")[1];
    result.task_id = taskId;
    cfg.demoTask = cfg.demoTask || taskId;
    console.log(`browsertest: created task ${taskId}; watching its stages`);

    const start = Date.now();
    const left = () => Math.max(1000, cfg.taskTimeout - (Date.now() - start));
    for (const s of STAGES) {
      try {
        await page.locator(`[data-testid=stage-${s}][data-state=done]`).waitFor({ state: "attached", timeout: left() });
      } catch {
        const states = await page.locator("[data-testid^=stage-][data-state]").evaluateAll(
          (els) => els.map((e) => `${e.dataset.testid}=${e.dataset.state}`).join(" "));
        const reason = (await tid(page, "failed-reason").textContent()) || "";
        const status = await tid(page, "task-status").textContent();
        throw new Failure(`stage ${s} was not marked done within ${cfg.taskTimeout} ms (status ${status}; ${states})${reason ? `; ${reason}` : ""}`);
      }
      console.log(`browsertest: stage ${s} done after ${((Date.now() - start) / 1000).toFixed(1)} s`);
    }

    // The four steps must have become done in order, each after being
    // shown in progress: the page followed the stage_change events.
    const log = await page.evaluate(() => window.__stageLog);
    result.stage_log = log;
    const firstDone = STAGES.map((s) => log.findIndex((e) => e.stage === s && e.state === "done"));
    const firstActive = STAGES.map((s) => log.findIndex((e) => e.stage === s && e.state === "active"));
    for (let i = 0; i < STAGES.length; i++) {
      check(firstActive[i] >= 0, `stage ${STAGES[i]} was never shown in progress (seen: ${JSON.stringify(log)})`);
      check(firstActive[i] < firstDone[i], `stage ${STAGES[i]} was marked done before it was shown in progress`);
      if (i > 0) check(firstDone[i - 1] < firstDone[i], `stage ${STAGES[i]} was marked done before ${STAGES[i - 1]}`);
    }

    await waitFor(tid(page, "pr-link"), "the pull request link", left());
    const prUrl = await tid(page, "pr-link").getAttribute("href");
    check(/\/pull\/\d+$/.test(prUrl || ""), `the PR link does not point at a pull request: ${prUrl}`);
    result.pr_url = prUrl;
    await page.waitForFunction(() => document.querySelector("[data-testid=task-status]")?.dataset.status === "TASK_STATUS_AWAITING_REVIEW",
      null, { timeout: 15000 }).catch(() => { throw new Failure("the task status did not become awaiting review"); });
    const diff = (await tid(page, "diff-stats").textContent()).trim();
    check(/^\+[\d,]+ −[\d,]+, [\d,]+ files?$/.test(diff), `unexpected diff stats: ${JSON.stringify(diff)}`);
    const cost = (await tid(page, "cost").textContent()).trim();
    check(/^\$\d/.test(cost), `unexpected cost: ${JSON.stringify(cost)}`);
    check((await tid(page, "log-tail").locator(".line").count()) > 0, "the log tail is empty");
    result.diff_stats = diff;
    result.cost = cost;

    const shot = path.join(cfg.outDir, "console-task.png");
    await page.screenshot({ path: shot, fullPage: true });
    result.screenshots.push(shot);

    // The list shows it too.
    await tid(page, "back").click();
    await waitFor(page.locator(`[data-testid=task-row][data-task-id="${taskId}"]`), "the task in the task list", 15000);
  },

  async validation(page, cfg, result) {
    await signIn(page, cfg);
    let posted = 0;
    page.on("request", (r) => { if (r.method() === "POST" && new URL(r.url()).pathname === "/v1/tasks") posted++; });

    // 1. Empty prompt: refused before any request, with the API's message.
    await tid(page, "create-repo").fill(cfg.repo);
    await tid(page, "create-prompt").fill("");
    await tid(page, "create-submit").click();
    await page.waitForFunction(() => document.querySelector("[data-testid=error-prompt]")?.textContent.trim(), null, { timeout: 5000 })
      .catch(() => { throw new Failure("no validation message appeared next to the prompt field"); });
    const msg = (await tid(page, "error-prompt").textContent()).trim();
    check(msg === "prompt: must not be empty", `prompt error is ${JSON.stringify(msg)}, want "prompt: must not be empty"`);
    check(await tid(page, "create-prompt").getAttribute("aria-invalid") === "true", "the prompt field is not marked aria-invalid");
    check(await tid(page, "create-prompt").evaluate((e) => e === document.activeElement), "the prompt field did not get the focus");
    check((await tid(page, "error-repo").textContent()).trim() === "", "the repo field shows an error for a valid repository");
    check(posted === 0, "an empty prompt was sent to the API");
    result.prompt_error = msg;
    const shot = path.join(cfg.outDir, "console-validation.png");
    await page.screenshot({ path: shot, fullPage: true });
    result.screenshots.push(shot);

    // 2. A message from the API's 400 answer lands next to its field.
    await tid(page, "create-prompt").fill(cfg.prompt);
    await tid(page, "create-base-branch").fill("bad..branch");
    await tid(page, "create-dispatch").uncheck();
    await tid(page, "create-submit").click();
    await page.waitForFunction(() => document.querySelector("[data-testid=error-base_branch]")?.textContent.trim(), null, { timeout: 10000 })
      .catch(() => { throw new Failure("the API's validation message for base_branch did not appear next to its field"); });
    const apiMsg = (await tid(page, "error-base_branch").textContent()).trim();
    check(apiMsg.startsWith("base_branch: "), `base_branch error is ${JSON.stringify(apiMsg)}, want the API's "base_branch: …" message`);
    check(posted === 1, `want exactly one POST /v1/tasks (the bad branch), saw ${posted}`);
    check((await tid(page, "error-prompt").textContent()).trim() === "", "the prompt error was not cleared");
    result.api_error = apiMsg;
  },

  async "daily-work"(page, cfg, result) {
    await signIn(page, cfg);
    // The sign-in page had no Tasks / Sign out links; now they are there.
    check(await tid(page, "nav-tasks").isVisible(), "the Tasks link is missing after sign-in");
    // Columns.
    const heads = await page.locator("[data-testid=task-list] thead th").allTextContents();
    for (const h of ["Status", "Prompt", "Repository", "PR", "Cost", "Failure reason", "Age"]) {
      check(heads.map((x) => x.trim().toLowerCase()).includes(h.toLowerCase()), `the list has no ${h} column (has ${heads.join(", ")})`);
    }
    // Create without dispatching: proposing, no live marker, a Dispatch button.
    await tid(page, "create-repo").fill(cfg.repo);
    await tid(page, "create-prompt").fill("Console dispatch check: add a --quiet flag to greet");
    await tid(page, "create-dispatch").uncheck();
    await tid(page, "create-submit").click();
    await page.waitForURL(/#\/tasks\/[0-9a-f-]{36}$/, { timeout: 15000 }).catch(() => { throw new Failure("the created task's page did not open"); });
    const id = page.url().split("#/tasks/")[1];
    result.dispatched_task = id;
    await page.waitForFunction(() => document.querySelector("[data-testid=task-status]")?.dataset.status === "TASK_STATUS_PROPOSING", null, { timeout: 10000 })
      .catch(() => { throw new Failure("the new task is not shown as proposing"); });
    await waitFor(tid(page, "dispatch-button"), "the Dispatch button of a proposing task", 10000);
    await page.waitForTimeout(1500); // let the stream connect
    const stream = await tid(page, "stream-state").evaluate((e) => ({ state: e.dataset.state, text: e.textContent, before: getComputedStyle(e, "::before").content }));
    check(stream.state !== "live" && !/live/.test(stream.text) && !String(stream.before).includes("●"),
      `a proposing task shows a live marker: ${JSON.stringify(stream)}`);
    result.proposing_stream = stream;
    await waitFor(page.locator("[data-testid=timeline-item][data-type=status_change]"), "the creation on the timeline", 10000);
    await tid(page, "dispatch-button").click();
    await page.waitForFunction(() => ["TASK_STATUS_RUNNING", "TASK_STATUS_QUEUED"].includes(document.querySelector("[data-testid=task-status]")?.dataset.status),
      null, { timeout: 15000 }).catch(() => { throw new Failure("Dispatch did not move the task to running or queued"); });
    await page.waitForFunction(() => document.querySelectorAll("[data-testid=timeline-item][data-type=status_change]").length >= 2, null, { timeout: 15000 })
      .catch(() => { throw new Failure("the dispatch's status change did not appear on the timeline"); });
    const lines = await page.locator("[data-testid=timeline-item]").allTextContents();
    check(lines.some((l) => /proposing → (running|queued) · .*by dev/.test(l)), `no "proposing → running/queued by dev" on the timeline: ${JSON.stringify(lines)}`);
    result.timeline = lines;
    check(await tid(page, "dispatch-button").isHidden(), "the Dispatch button is still shown after dispatching");
    // Cancel it again (not awaiting review: no PR warning).
    check(await tid(page, "cancel-warning").isHidden(), "a running task warns about closing a pull request");
    await tid(page, "cancel-button").click();
    await page.waitForFunction(() => document.querySelector("[data-testid=task-status]")?.dataset.status === "TASK_STATUS_CANCELLED", null, { timeout: 15000 })
      .catch(() => { throw new Failure("Cancel did not cancel the dispatched task"); });
    await waitFor(tid(page, "retry-button"), "the Retry button of a cancelled task", 5000);

    // Filters: by status, and by a repository with no tasks.
    await tid(page, "back").click();
    await waitFor(tid(page, "task-list").locator("[data-testid=task-row]").first(), "the task rows", 15000);
    await tid(page, "filter-status").selectOption("cancelled");
    await tid(page, "filter-apply").click();
    await page.waitForFunction(() => {
      const rows = [...document.querySelectorAll("[data-testid=task-row]")];
      return rows.length > 0 && rows.every((r) => r.dataset.status === "TASK_STATUS_CANCELLED");
    }, null, { timeout: 15000 }).catch(() => { throw new Failure("the status filter did not leave only cancelled tasks"); });
    check(await page.locator(`[data-testid=task-row][data-task-id="${id}"]`).count() === 1, "the cancelled task is not in the cancelled filter");
    const reason = (await page.locator(`[data-testid=task-row][data-task-id="${id}"] [data-testid=row-reason]`).textContent()).trim();
    check(reason.includes("cancelled from the console"), `the failure reason column shows ${JSON.stringify(reason)}`);
    const shot = path.join(cfg.outDir, "console-list.png");
    await page.screenshot({ path: shot, fullPage: true });
    result.screenshots.push(shot);
    await tid(page, "filter-status").selectOption("");
    await tid(page, "filter-repo").fill("nobody/nothing");
    await tid(page, "filter-apply").click();
    await waitFor(tid(page, "list-empty"), "the empty list for an unknown repository", 15000);
    check(await page.locator("[data-testid=task-row]").count() === 0, "the repository filter left rows of other repositories");
    await tid(page, "filter-clear").click();
    await waitFor(page.locator("[data-testid=task-row]").first(), "the rows after clearing the filters", 15000);
  },

  async queue(page, cfg, result) {
    await signIn(page, cfg);
    const headers = { Authorization: `Bearer ${cfg.token}`, "Content-Type": "application/json" };
    const created = [];
    let queued = null;
    try {
      for (let i = 0; i < 6 && !queued; i++) {
        const r = await page.request.post(`${cfg.base}/v1/tasks`, { headers, data: { repo: cfg.repo, prompt: `Queue check ${i}: add a --loud flag to greet`, dispatch: true } });
        check(r.ok(), `creating a task failed: ${r.status()} ${await r.text()}`);
        const t = (await r.json()).task;
        created.push(t.id);
        if (t.status === "TASK_STATUS_QUEUED") queued = t;
      }
      check(queued, `none of ${created.length} dispatched tasks was queued`);
      result.queued_task = queued.id;
      await page.goto(`${cfg.base}/#/tasks/${queued.id}`);
      await waitFor(tid(page, "queue-position"), "the queue position on the page of a queued task", 15000);
      const q = (await tid(page, "queue-position").textContent()).trim();
      check(/^#\d+ in the dispatch queue/.test(q), `queue position reads ${JSON.stringify(q)}`);
      check(q.startsWith(`#${Number(queued.queue_position)} `), `queue position ${JSON.stringify(q)} is not the API's ${queued.queue_position}`);
      await waitFor(page.locator("[data-testid=timeline-item][data-type=status_change]").filter({ hasText: "queued" }), "proposing → queued on the timeline", 10000);
      const tl = await page.locator("[data-testid=timeline-item]").allTextContents();
      check(tl.some((l) => /→ queued · position \d+ in the queue · by /.test(l)), `the timeline does not show the queue position: ${JSON.stringify(tl)}`);
      const stream = await tid(page, "stream-state").getAttribute("data-state");
      check(stream !== "live", "a queued task shows the live marker");
      result.queue_text = q;
      const shot = path.join(cfg.outDir, "console-queue.png");
      await page.screenshot({ path: shot, fullPage: true });
      result.screenshots.push(shot);
      await tid(page, "back").click();
      await waitFor(page.locator(`[data-testid=task-row][data-task-id="${queued.id}"] [data-testid=row-queue]`), "the queue position in the list", 15000);
    } finally {
      for (const id of created) await page.request.post(`${cfg.base}/v1/tasks/${id}:cancel`, { headers, data: { reason: "browser test cleanup" } }).catch(() => {});
    }
  },

  async trace(page, cfg, result) {
    check(cfg.demoTask, "no demo task: run create-task first or set DEMO_TASK_ID");
    await signIn(page, cfg);
    await page.goto(`${cfg.base}/#/tasks/${cfg.demoTask}`);
    await waitFor(tid(page, "trace-card"), "the trace card", 15000);
    // The runner's spans reach Jaeger a moment after the task ends.
    const deadline = Date.now() + 60000;
    for (;;) {
      await page.locator("[data-testid=span-row]").first().waitFor({ state: "attached", timeout: 5000 }).catch(() => {});
      const names = await page.locator("[data-testid=span-row]").evaluateAll((els) => els.map((e) => e.dataset.name));
      if (names.some((n) => n.startsWith("stage.")) || Date.now() > deadline) break;
      await tid(page, "trace-refresh").click();
    }
    const spans = await page.locator("[data-testid=span-row]").evaluateAll((els) => els.map((e) => ({ name: e.dataset.name, service: e.dataset.service, error: e.dataset.error })));
    result.spans = spans.length;
    const names = spans.map((s) => s.name);
    for (const want of ["runner", "stage.explore", "stage.apply", "git.push"]) {
      check(names.includes(want), `the waterfall has no ${want} span (has ${names.join(", ")}); ${await tid(page, "trace-state").textContent()}`);
    }
    check(new Set(spans.map((s) => s.service)).size >= 2, "the waterfall shows one service only");
    // Cost per stage is drawn from the task's events, which arrive over SSE.
    await page.locator("[data-testid=stage-cost]").first().waitFor({ state: "attached", timeout: 30000 }).catch(() => {});
    const costs = await page.locator("[data-testid=stage-cost]").evaluateAll((els) => els.map((e) => [e.dataset.stage, e.querySelector(".cost-value").textContent]));
    result.stage_costs = costs;
    check(costs.length >= 1, "no cost per stage");
    check(costs.some(([, c]) => Number(c.slice(1)) > 0), `every stage cost is zero: ${JSON.stringify(costs)}`);
    const logText = (await tid(page, "log-tail").textContent()) || "";
    check(!/\/(work|workspace)\/repo\//.test(logText), "the log shows absolute sandbox paths");
    await tid(page, "trace-card").scrollIntoViewIfNeeded();
    const shot = path.join(cfg.outDir, "console-trace.png");
    await page.screenshot({ path: shot, fullPage: true });
    result.screenshots.push(shot);
  },

  async cors(page, cfg, result) {
    const headers = { Authorization: `Bearer ${cfg.token}`, "Content-Type": "application/json" };
    // A task whose stream has an event: the demo task, or one made here.
    let task = cfg.demoTask;
    let made = "";
    if (!task) {
      const r = await page.request.post(`${cfg.base}/v1/tasks`, { headers, data: { repo: cfg.repo, prompt: "CORS check: add a --cors flag to greet" } });
      check(r.ok(), `creating a task for the stream failed: ${r.status()} ${await r.text()}`);
      task = made = (await r.json()).task.id;
    }
    const run = async (pageURL) => {
      const u = new URL(pageURL);
      // The token travels in the fragment: never sent to the page's server.
      u.hash = new URLSearchParams({ api: cfg.base, token: cfg.token, task }).toString();
      await page.goto(u.href, { waitUntil: "domcontentloaded" });
      await page.waitForFunction(() => document.querySelector("[data-testid=cors-result]")?.dataset.state === "done", null, { timeout: 40000 })
        .catch(() => { throw new Failure(`the page at ${u.origin} did not finish its calls within 40 s`); });
      return JSON.parse(await tid(page, "cors-result").textContent());
    };
    try {
      const ok = await run(cfg.corsPage);
      result.allowed = ok;
      check(ok.origin !== new URL(cfg.base).origin, `the page is not of another origin (${ok.origin})`);
      check(ok.list_status === 200 && ok.list_tasks >= 0, `GET /v1/tasks from ${ok.origin}: ${JSON.stringify(ok)}`);
      check(/\S/.test(ok.list_request_id), `X-Request-Id is not exposed to ${ok.origin}: ${JSON.stringify(ok)}`);
      check(ok.create_status === 400 && /^(repo|prompt): /.test(ok.create_message || ""),
        `the preflighted POST's 400 is not readable from ${ok.origin}: ${JSON.stringify(ok)}`);
      check(/^status_change TASK_STATUS_/.test(ok.sse_event || "") && Number(ok.sse_id) >= 1,
        `no event over EventSource from ${ok.origin}: ${JSON.stringify(ok)}`);
      const shot = path.join(cfg.outDir, "console-cors.png");
      await page.screenshot({ path: shot, fullPage: true });
      result.screenshots.push(shot);

      const denied = await run(cfg.corsDeniedPage);
      result.denied = denied;
      check(denied.list_error && !denied.list_status, `GET /v1/tasks succeeded from the origin that is not allowed, ${denied.origin}: ${JSON.stringify(denied)}`);
      check(denied.create_error && !denied.create_status, `the POST succeeded from ${denied.origin}: ${JSON.stringify(denied)}`);
      check(denied.sse_error && !denied.sse_event, `the event stream opened from ${denied.origin}: ${JSON.stringify(denied)}`);
    } finally {
      if (made) await page.request.post(`${cfg.base}/v1/tasks/${made}:cancel`, { headers, data: { reason: "browser test cleanup" } }).catch(() => {});
    }
  },

  async "cancel-review"(page, cfg, result) {
    check(cfg.demoTask, "no demo task: run create-task first or set DEMO_TASK_ID");
    // The pull request the warning must name, as the API reports it.
    const res = await page.request.get(`${cfg.base}/v1/tasks/${cfg.demoTask}`, { headers: { Authorization: `Bearer ${cfg.token}` } });
    check(res.ok(), `GET /v1/tasks/${cfg.demoTask}: ${res.status()}`);
    const task = (await res.json()).task;
    const pr = /\/pull\/(\d+)$/.exec(task.pr_url || "");
    check(pr, `the demo task has no pull request: pr_url ${JSON.stringify(task.pr_url)}`);
    result.pr_number = pr[1];
    await signIn(page, cfg);
    await page.goto(`${cfg.base}/#/tasks/${cfg.demoTask}`);
    await page.waitForFunction(() => document.querySelector("[data-testid=task-status]")?.dataset.status === "TASK_STATUS_AWAITING_REVIEW", null, { timeout: 15000 })
      .catch(() => { throw new Failure("the demo task is not awaiting review"); });
    await waitFor(tid(page, "cancel-warning"), "the warning that cancelling closes the pull request", 5000);
    const warning = (await tid(page, "cancel-warning").textContent()).trim();
    const want = `Cancelling this task closes its open pull request #${pr[1]} `;
    check(warning.startsWith(want), `the warning reads ${JSON.stringify(warning)}, want it to start with ${JSON.stringify(want)}`);
    const label = (await tid(page, "cancel-button").textContent()).trim();
    check(/close PR/.test(label), `the cancel button reads ${JSON.stringify(label)}`);
    const described = await tid(page, "cancel-button").getAttribute("aria-describedby");
    check(described === "cancel-warning", `the cancel button is not described by the warning (aria-describedby ${JSON.stringify(described)})`);
    // The page opens the stream once its first GET has answered (that GET
    // also shows the warning): it reads "connecting…" until the gateway's
    // headers arrive, then "live", and stays open until the end.
    const opened = Date.now();
    await page.waitForFunction(() => document.querySelector("[data-testid=stream-state]")?.dataset.state === "live", null, { timeout: 10000 })
      .catch(async () => {
        const live = await tid(page, "stream-state").getAttribute("data-state");
        throw new Failure(`an awaiting-review task's stream is ${live} after 10 s, want live (it stays open until the end)`);
      });
    result.live_after_ms = Date.now() - opened;
    result.warning = warning;
    const shot = path.join(cfg.outDir, "console-cancel-review.png");
    await page.screenshot({ path: shot, fullPage: true });
    result.screenshots.push(shot);
    // The warning is still on screen at the moment of the click.
    check(await tid(page, "cancel-warning").isVisible(), "the warning disappeared before the click");
    await tid(page, "cancel-button").click();
    await page.waitForFunction(() => document.querySelector("[data-testid=task-status]")?.dataset.status === "TASK_STATUS_CANCELLED", null, { timeout: 15000 })
      .catch(() => { throw new Failure("the awaiting-review task was not cancelled"); });
    await waitFor(page.locator("[data-testid=timeline-item][data-type=status_change]").filter({ hasText: "awaiting review → cancelled" }), "the cancel on the timeline", 15000);
    await page.waitForFunction(() => document.querySelector("[data-testid=stream-state]")?.dataset.state === "ended", null, { timeout: 15000 })
      .catch(() => { throw new Failure("the stream did not end after the final status change"); });
    check(await tid(page, "cancel-warning").isHidden() && await tid(page, "cancel-button").isHidden(), "a cancelled task still offers Cancel or its warning");
  },
};

async function main() {
  const cfg = await config();
  await mkdir(cfg.outDir, { recursive: true });
  let browser;
  try {
    browser = await chromium.launch({
      executablePath: cfg.chromium,
      headless: true,
      // Debian's Chromium as root, on a machine without outside network.
      args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"],
    });
  } catch (e) {
    console.error(`browsertest: cannot start ${cfg.chromium} (apt-get install chromium): ${e.message.split("\n")[0]}`);
    process.exit(1);
  }
  const results = [];
  let failed = 0;
  for (const name of cfg.scenarios) {
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    const page = await context.newPage();
    const pageErrors = [];
    page.on("pageerror", (e) => pageErrors.push(e.message));
    page.on("console", (m) => { if (m.type() === "error") pageErrors.push(`console: ${m.text()}`); });
    const result = { scenario: name, ok: false, screenshots: [] };
    const t0 = Date.now();
    try {
      await SCENARIOS[name](page, cfg, result);
      const uncaught = pageErrors.filter((m) => !m.startsWith("console: "));
      check(uncaught.length === 0, `the page threw: ${uncaught.join("; ")}`);
      result.ok = true;
      console.log(`browsertest: PASS ${name} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
    } catch (e) {
      failed++;
      result.error = e instanceof Failure ? e.message : `${e.name}: ${e.message}`;
      const shot = path.join(cfg.outDir, `failure-${name}.png`);
      await page.screenshot({ path: shot, fullPage: true }).then(() => result.screenshots.push(shot), () => {});
      console.error(`browsertest: FAIL ${name}: ${result.error}`);
      if (pageErrors.length) console.error(`browsertest: page errors: ${pageErrors.join(" | ")}`);
      console.error(`browsertest: screenshot of the failure: ${shot}`);
    }
    result.page_errors = pageErrors;
    result.seconds = (Date.now() - t0) / 1000;
    results.push(result);
    await context.close();
  }
  await browser.close();
  await writeFile(path.join(cfg.outDir, cfg.resultFile), JSON.stringify({ base_url: cfg.base, results }, null, 2) + "\n");
  for (const r of results) for (const s of r.screenshots) console.log(`browsertest: artifact ${s}`);
  process.exit(failed ? 1 : 0);
}

main().catch((e) => {
  console.error(`browsertest: ${e.stack || e}`);
  process.exit(1);
});
