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
console.log("ok");
