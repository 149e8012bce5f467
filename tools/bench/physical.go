package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/taskrunner/taskrunner/platform/eventwire"
)

// The physical reference is what PostgreSQL on this host does with the
// new design's rows when nothing else is in the way: the workload's events
// (the same task_events columns and payloads as the Events service stores,
// for tasks made the same way) inserted by plain pgx.Batch, ReferenceBatch
// rows per transaction, by one writer per runner, each over a connection of
// its own. It runs in this process against the same database, right before
// the new design's run without added rtt, so the two figures meet the same
// host. No runner protocol, no state machine, no Redis, no SSE: it bounds
// what a durable ingest of these rows can reach here, and the new design's
// events/s is printed beside it.
//
// Payloads are encoded before the clock starts (the reference measures the
// database); each batch is sent with SendBatch, whose one Sync makes it a
// single implicit transaction, committed (durably, synchronous_commit on)
// before the writer sends its next.
// ReferenceBatch is the reference's rows per transaction.
const ReferenceBatch = 100

const insertReferenceRow = `INSERT INTO task_events (task_id, seq, runner_seq, run, type, payload) VALUES ($1, $2, $3, $4, $5, $6)`

// referenceRow is one task_events row of the reference.
type referenceRow struct {
	seq, runnerSeq int64
	typ            string
	payload        []byte
}

// runReference performs the physical reference for sc (Runners writers of
// Events rows each, capped at sc.Cap).
func (e *Env) runReference(ctx context.Context, sc Scenario) (Result, error) {
	res := Result{Scenario: sc, Target: int64(sc.Runners) * int64(sc.Events)}
	ids, err := e.runningTasks(ctx, sc.Runners)
	if err != nil {
		return res, err
	}
	rows := make([][]referenceRow, len(ids))
	now := time.Now()
	for r, id := range ids {
		var last int64 // the control plane's events of the task's creation come first
		if err := e.Pool.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM task_events WHERE task_id = $1`, id).Scan(&last); err != nil {
			return res, err
		}
		rows[r] = make([]referenceRow, sc.Events)
		for i := range sc.Events {
			ev := workloadEvent(r, i, sc.Events, sc.DiffEvery)
			ev.Time = timestamppb.New(now)
			ev.Seq = last + int64(i) + 1
			payload, err := eventwire.EncodeEvent(ev)
			if err != nil {
				return res, err
			}
			rows[r][i] = referenceRow{seq: ev.Seq, runnerSeq: int64(i) + 1, typ: eventwire.TypeName(ev), payload: payload}
		}
	}

	cpu0, srv0 := cpuTime(), serverCPU("postgres", "redis-server")
	start := time.Now()
	deadline := start.Add(sc.Cap)
	var acked atomic.Int64
	var firstErr error
	var errOnce sync.Once
	lat := make([][]time.Duration, len(ids))
	var wg sync.WaitGroup
	for r, id := range ids {
		wg.Go(func() {
			for from := 0; from < len(rows[r]); from += ReferenceBatch {
				if time.Now().After(deadline) || ctx.Err() != nil {
					return
				}
				chunk := rows[r][from:min(from+ReferenceBatch, len(rows[r]))]
				b := &pgx.Batch{}
				for _, row := range chunk {
					b.Queue(insertReferenceRow, id, row.seq, row.runnerSeq, int32(1), row.typ, row.payload)
				}
				t0 := time.Now()
				if err := e.basePool.SendBatch(ctx, b).Close(); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				lat[r] = append(lat[r], time.Since(t0))
				acked.Add(int64(len(chunk)))
			}
		})
	}
	wg.Wait()
	end := time.Now()
	res.CPU = cpuTime() - cpu0
	res.ServerCPU = serverCPU("postgres", "redis-server") - srv0
	if firstErr != nil {
		return res, fmt.Errorf("bench: the reference's insert failed: %w", firstErr)
	}
	res.Acked = acked.Load()
	res.Window = end.Sub(start)
	if res.Acked < res.Target {
		res.Capped, res.Window = true, sc.Cap
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	res.AckLatency = Summarise(all) // per transaction of ReferenceBatch rows
	return res, nil
}
