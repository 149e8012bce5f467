-- +goose Up
-- One timeline per task: task_events holds the runner's events and the
-- control plane's (status_change, queue_position, sandbox) in one gap-free
-- seq per task. runner_seq is the runner's own counter of the events it
-- sent (NULL for the control plane's), which deduplicates resends and is
-- what Welcome.last_persisted_seq reports. Every event stored before this
-- migration came from a runner, with seq = runner_seq.
ALTER TABLE task_events ADD COLUMN runner_seq bigint CHECK (runner_seq > 0);
UPDATE task_events SET runner_seq = seq;

-- +goose Down
ALTER TABLE task_events DROP COLUMN runner_seq;
