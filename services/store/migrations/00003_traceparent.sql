-- +goose Up
-- The W3C traceparent of the task.create span: Dispatch continues the task's
-- one trace from it, even when dispatch is a separate REST call.
ALTER TABLE tasks ADD COLUMN traceparent text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE tasks DROP COLUMN traceparent;
