-- +goose Up
-- The Events committer remembers, for each task it has just written, the
-- task's state and its last event seq, and then writes the task's next
-- batch in one round trip: BEGIN, this check, the writes, COMMIT. The check
-- locks the tasks (in id order, like every multi-task lock) and raises
-- SQLSTATE TR001 when any of them changed since (another writer moved the
-- task, or another replica stored events): the transaction then aborts and
-- the committer reads the tasks afresh.
-- +goose StatementBegin
CREATE FUNCTION taskrunner_events_expect(ids uuid[], stamps timestamptz[], statuses text[], stages text[], seqs bigint[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	matched int;
BEGIN
	PERFORM 1 FROM tasks WHERE id = ANY(ids) ORDER BY id FOR UPDATE;
	-- A statement of its own, so under READ COMMITTED it sees whatever was
	-- committed before the locks were granted.
	SELECT count(*) INTO matched
	FROM unnest(ids, stamps, statuses, stages, seqs) AS e(id, stamp, status, stage, seq)
	JOIN tasks t ON t.id = e.id AND t.updated_at = e.stamp AND t.status = e.status AND t.stage = e.stage
	WHERE e.seq = coalesce((SELECT s.seq FROM task_events s WHERE s.task_id = e.id ORDER BY s.seq DESC LIMIT 1), 0);
	IF matched <> cardinality(ids) THEN
		RAISE EXCEPTION 'taskrunner: the committer''s view of % task(s) is stale', cardinality(ids) - matched
			USING ERRCODE = 'TR001';
	END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION taskrunner_events_expect(uuid[], timestamptz[], text[], text[], bigint[]);
