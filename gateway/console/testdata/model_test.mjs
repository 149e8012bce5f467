// Unit checks of the console's pure functions (static/model.js), run by
// TestModelJS with Node.js. No test framework: node:assert only.
import * as m from "../static/model.js";
import assert from "node:assert/strict";
assert.deepEqual(m.stageStates("TASK_STAGE_APPLY", "running"), ["done","done","active","pending"]);
assert.deepEqual(m.stageStates("", "idle"), ["pending","pending","pending","pending"]);
assert.deepEqual(m.stageStates("TASK_STAGE_PROPOSE", "failed"), ["done","failed","pending","pending"]);
assert.deepEqual(m.stageStates("TASK_STAGE_ARCHIVE", "completed"), ["done","done","done","done"]);
assert.deepEqual(m.stageStates("TASK_STAGE_EXPLORE", "cancelled"), ["stopped","pending","pending","pending"]);
assert.equal(m.laterStage("TASK_STAGE_APPLY", "TASK_STAGE_EXPLORE"), "TASK_STAGE_APPLY");
assert.deepEqual(m.validateCreate({repo:"demo/greet", prompt:" "}), {prompt:"prompt: must not be empty"});
assert.deepEqual(m.validateCreate({repo:"bad", prompt:"x"}), {repo:'repo: must be of the form owner/name, got "bad"'});
assert.deepEqual(m.validateCreate({repo:"", prompt:""}), {repo:"repo: must not be empty", prompt:"prompt: must not be empty"});
assert.deepEqual(m.validateCreate({repo:"-x/y", prompt:"p"}), {repo:'repo: owner "-x" is not a valid GitHub account name'});
assert.equal(m.formatDiff({additions:"2737", deletions:"4", files_changed:"1"}), "+2,737 −4, 1 file");
assert.equal(m.formatUsage({cost_usd:0.2932, tokens_in:"38000", tokens_out:"7060"}), "$0.2932 · 38,000 tokens in, 7,060 out");
assert.equal(m.statusLabel("TASK_STATUS_AWAITING_REVIEW"), "awaiting review");
// daily work
assert.deepEqual(m.actionsFor({status:"TASK_STATUS_PROPOSING"}), {dispatch:true, cancel:true, cancelClosesPR:false, retry:false, followUp:false});
assert.deepEqual(m.actionsFor({status:"TASK_STATUS_AWAITING_REVIEW"}), {dispatch:false, cancel:true, cancelClosesPR:true, retry:false, followUp:true});
assert.deepEqual(m.actionsFor({status:"TASK_STATUS_FAILED"}), {dispatch:false, cancel:false, cancelClosesPR:false, retry:true, followUp:false});
assert.deepEqual(m.actionsFor({status:"TASK_STATUS_FAILED", pr_url:"https://github.com/a/b/pull/1"}), {dispatch:false, cancel:false, cancelClosesPR:false, retry:true, followUp:true});
assert.equal(m.actionsFor({status:"TASK_STATUS_RUNNING", pr_url:"https://github.com/a/b/pull/1"}).followUp, false);
assert.equal(m.actionsFor({status:"TASK_STATUS_DONE", pr_url:"https://github.com/a/b/pull/1"}).followUp, false);
assert.equal(m.streamShowsLive("TASK_STATUS_QUEUED"), false);
assert.equal(m.streamShowsLive("TASK_STATUS_PROPOSING"), false);
assert.equal(m.streamShowsLive("TASK_STATUS_RUNNING"), true);
assert.equal(m.statusChangeText({from:"TASK_STATUS_PROPOSING", to:"TASK_STATUS_QUEUED", actor:"user:alice", queue_position:"2", reason:"repository at capacity"}),
  "proposing → queued · position 2 in the queue · by alice · repository at capacity");
assert.equal(m.statusChangeText({to:"TASK_STATUS_PROPOSING", actor:"user:bob"}), "created → proposing · by bob");
assert.equal(m.statusChangeText({from:"TASK_STATUS_RUNNING", to:"TASK_STATUS_FAILED", actor:"reaper", reason:"timeout"}), "running → failed · by reaper · timeout");
assert.equal(m.sandboxText({state:"started", provider:"process", sandbox_id:"tr-1"}), "sandbox started (process, id tr-1)");
assert.equal(m.sandboxText({state:"failed", provider:"docker", reason:"no image"}), "sandbox failed (docker): no image");
assert.equal(m.queueText("TASK_STATUS_QUEUED", "1"), "#1 in the dispatch queue (next to start)");
assert.equal(m.queueText("TASK_STATUS_QUEUED", "3"), "#3 in the dispatch queue");
assert.equal(m.queueText("TASK_STATUS_RUNNING", "3"), "");
assert.equal(m.relativePaths("> Write: /workspace/repo/openspec/changes/x/proposal.md"), "> Write: openspec/changes/x/proposal.md");
assert.equal(m.relativePaths("edit /tmp/e2e/sandboxes/tr-abc/work/repo/greet done"), "edit greet done");
assert.equal(m.relativePaths("cd /tmp/taskrunner-1234-5678/repo && ls"), "cd . && ls");
assert.equal(m.relativePaths("cfg /workspace/home/.claude.json"), "cfg ~/.claude.json");
assert.equal(m.relativePaths("cat /workspace/notes.txt"), "cat notes.txt");
assert.equal(m.relativePaths("docs/workspace/x.md"), "docs/workspace/x.md");
assert.equal(m.relativePaths("see https://example.com/x and /usr/bin/git"), "see https://example.com/x and /usr/bin/git");
assert.deepEqual(m.stageCosts([{type:"usage", cost:0.01}, {type:"stage", stage:"TASK_STAGE_EXPLORE"}, {type:"usage", cost:0.05},
  {type:"stage", stage:"TASK_STAGE_PROPOSE"}, {type:"usage", cost:0.12}, {type:"usage", cost:0.2}, {type:"stage", stage:"TASK_STAGE_APPLY"}])
  .map((x) => [x.stage, +x.cost.toFixed(4)]), [["TASK_STAGE_EXPLORE", 0.05], ["TASK_STAGE_PROPOSE", 0.15], ["TASK_STAGE_APPLY", 0]]);
// A follow-up's stages are its own rows, by run, even where a stage repeats.
assert.deepEqual(m.stageCosts([{type:"stage", stage:"TASK_STAGE_PROPOSE"}, {type:"usage", cost:0.1}, {type:"stage", stage:"TASK_STAGE_PROPOSE", run:2},
  {type:"usage", cost:0.15}]).map((x) => [x.run, x.stage, +x.cost.toFixed(4)]), [[1, "TASK_STAGE_PROPOSE", 0.1], [2, "TASK_STAGE_PROPOSE", 0.05]]);
assert.equal(m.formatDuration(1500), "2 ms");
assert.equal(m.formatDuration(2500000), "2.5 s");
assert.equal(m.formatDuration(125e6), "2 min 5 s");
assert.deepEqual(m.waterfallBar({start_us:250, duration_us:500}, 1000), {left:25, width:50});
assert.deepEqual(m.waterfallBar({start_us:"0", duration_us:"0"}, "1000"), {left:0, width:0.3});
assert.equal(m.formatAge("2026-01-01T00:00:00Z", Date.parse("2026-01-01T00:05:30Z")), "5 min");
assert.equal(m.formatAge("2026-01-01T00:00:00Z", Date.parse("2026-01-03T01:00:00Z")), "2 d");
assert.equal(m.formatCost({cost_usd:0.2932}), "$0.2932");
assert.equal(m.formatCost(undefined), "—");
// runs, follow-ups, budget
assert.equal(m.triggerLabel("review"), "review");
assert.equal(m.triggerLabel("create"), "first run");
assert.equal(m.requesterLabel("github:octocat"), "@octocat");
assert.equal(m.requesterLabel("user:alice"), "alice");
assert.deepEqual(m.runRows({prompt:"Add a flag", run:2, runs:[
  {number:1, trigger:"create", prompt:"", state:"finished", requested_by:"user:alice", diff_stats:{additions:"12", deletions:"1", files_changed:"2"}, usage:{cost_usd:0.25}, create_time:"2026-01-01T00:00:00Z"},
  {number:2, trigger:"review", prompt:"src/a.go:3: rename it", state:"running", requested_by:"github:octocat", diff_stats:{}, usage:{}, create_time:"2026-01-01T01:00:00Z"}]}),
  [{number:2, title:"Run 2 · review by @octocat", prompt:"src/a.go:3: rename it", state:"running", diff:"", cost:"—", created:"2026-01-01T01:00:00Z", current:true},
   {number:1, title:"Run 1 · first run by alice", prompt:"Add a flag", state:"finished", diff:"+12 −1, 2 files", cost:"$0.2500", created:"2026-01-01T00:00:00Z", current:false}]);
assert.deepEqual(m.runRows({prompt:"p"}), []);
assert.deepEqual(m.validateFollowUp("  "), {prompt:"prompt: is required: say what the follow-up should change"});
assert.deepEqual(m.validateFollowUp("rename it"), {});
assert.match(m.validateFollowUp("é".repeat(20000)).prompt, /^prompt: is 40000 bytes, more than the limit of 32768$/);
assert.equal(m.budgetText({max_budget_usd:5, usage:{cost_usd:0.2932}}), "$0.2932 of $5.00 (per run)");
assert.equal(m.budgetText({max_budget_usd:5, run:2, usage:{cost_usd:3.02}, runs:[{number:1, usage:{cost_usd:1.1}}, {number:2, usage:{cost_usd:1.92}}]}),
  "$1.92 of $5.00 in run 2 (per run)");
assert.equal(m.budgetText({usage:{}}), "");
assert.equal(m.quotaText({daily_usd:10, spent_today_usd:1.75, resets_time:"2026-01-02T00:00:00Z"}, Date.parse("2026-01-01T20:30:00Z")),
  "$1.75 of $10.00 spent today · resets in 3 h 30 min");
assert.equal(m.quotaText({daily_usd:2, spent_today_usd:2.5, resets_time:"2026-01-02T00:00:00Z"}, Date.parse("2026-01-01T23:50:00Z")),
  "$2.50 of $2.00 spent today (quota reached: new runs are refused) · resets in 10 min");
assert.equal(m.quotaText(undefined, 0), "");
console.log("ok");
