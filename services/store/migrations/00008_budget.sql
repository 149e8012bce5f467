-- +goose Up
-- A per-task budget for model calls, set at create (CreateTaskRequest.max_budget_usd).
-- NULL: the server's maximum (TASKRUNNER_MAX_BUDGET_USD), which also bounds a set value
-- wherever the budget is enforced (the model proxy takes the smaller of the two).
ALTER TABLE tasks ADD COLUMN max_budget_usd double precision CHECK (max_budget_usd IS NULL OR max_budget_usd > 0);

-- +goose Down
ALTER TABLE tasks DROP COLUMN max_budget_usd;
