package events

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

func intakeSub(task string, seq int64) *submission {
	return &submission{taskID: task, ev: &taskrunnerv1.Event{Seq: seq}}
}

// TestIntakeKeepsEachTaskInOneBatchInOrder: streams put while three
// committers take and release at random paces; every submission is taken
// once, each task's in the order they were put, and no task is ever in two
// committers' hands at once.
func TestIntakeKeepsEachTaskInOneBatchInOrder(t *testing.T) {
	const tasks, perTask, committers = 12, 400, 3
	in := newIntake(committers, 64, 5)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var mu sync.Mutex
	next := map[string]int64{} // next seq expected per task
	holder := map[string]int{} // committer holding the task
	var taken atomic.Int64
	var cwg sync.WaitGroup
	for k := range committers {
		cwg.Go(func() {
			for {
				batch, held := in.take(ctx, k, 50, 0, nil)
				if batch == nil {
					return
				}
				mu.Lock()
				for _, tq := range held {
					if h, ok := holder[tq.id]; ok {
						t.Errorf("task %s taken by committer %d while %d holds it", tq.id, k, h)
					}
					holder[tq.id] = k
				}
				for _, s := range batch {
					if want := next[s.taskID] + 1; s.ev.GetSeq() != want {
						t.Errorf("task %s: took seq %d, want %d", s.taskID, s.ev.GetSeq(), want)
					}
					next[s.taskID] = s.ev.GetSeq()
				}
				mu.Unlock()
				taken.Add(int64(len(batch)))
				time.Sleep(time.Duration(rand.N(300)) * time.Microsecond) // the commit
				mu.Lock()
				for _, tq := range held {
					delete(holder, tq.id)
				}
				mu.Unlock()
				in.release(held)
			}
		})
	}
	var pwg sync.WaitGroup
	for i := range tasks {
		id := fmt.Sprintf("task-%02d", i)
		pwg.Go(func() {
			for seq := int64(1); seq <= perTask; seq++ {
				require.True(t, in.enter(nil, ctx.Done()))
				in.put(intakeSub(id, seq))
				if rand.N(8) == 0 {
					time.Sleep(time.Duration(rand.N(200)) * time.Microsecond)
				}
			}
		})
	}
	pwg.Wait()
	require.Eventually(t, func() bool { return taken.Load() == tasks*perTask }, 10*time.Second, time.Millisecond)
	cancel()
	cwg.Wait()
	for i := range tasks {
		require.Equal(t, int64(perTask), next[fmt.Sprintf("task-%02d", i)])
	}
	require.Empty(t, in.tasks, "a task without submissions is forgotten")
	require.Zero(t, len(in.room), "every room token is back")
}

// TestIntakeOverflowCommitters: while the first committer is busy, the
// second takes nothing until overflowAt submissions wait; the first takes
// anything.
func TestIntakeOverflowCommitters(t *testing.T) {
	in := newIntake(2, 100, 4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan int, 10)
	go func() {
		for {
			batch, held := in.take(ctx, 1, 100, 0, nil)
			if batch == nil {
				return
			}
			got <- len(batch)
			in.release(held)
		}
	}()
	for i := range 3 {
		require.True(t, in.enter(nil, nil))
		in.put(intakeSub(fmt.Sprint("t", i), 1))
	}
	select {
	case n := <-got:
		t.Fatalf("the second committer took %d submissions below the overflow mark", n)
	case <-time.After(50 * time.Millisecond):
	}
	require.True(t, in.enter(nil, nil))
	in.put(intakeSub("t3", 1))
	select {
	case n := <-got:
		require.Equal(t, 4, n, "at the mark the second committer takes the waiting work")
	case <-time.After(5 * time.Second):
		t.Fatal("the second committer never took the work at the overflow mark")
	}

	// The first committer takes a single submission.
	require.True(t, in.enter(nil, nil))
	in.put(intakeSub("t9", 1))
	batch, held := in.take(ctx, 0, 100, 0, nil)
	require.Len(t, batch, 1)
	in.release(held)
}

// TestIntakeDelayGathersMore: with a delay, a batch also gets what arrives
// meanwhile, for the tasks it holds and for new ones, up to max.
func TestIntakeDelayGathersMore(t *testing.T) {
	in := newIntake(1, 100, 1)
	ctx := context.Background()
	require.True(t, in.enter(nil, nil))
	in.put(intakeSub("a", 1))
	go func() {
		time.Sleep(10 * time.Millisecond)
		for _, s := range []*submission{intakeSub("a", 2), intakeSub("b", 1), intakeSub("a", 3)} {
			in.enter(nil, nil)
			in.put(s)
		}
	}()
	batch, held := in.take(ctx, 0, 3, time.Second, nil)
	require.Len(t, batch, 3, "full before the delay ends")
	var seqs []string
	for _, s := range batch {
		seqs = append(seqs, fmt.Sprint(s.taskID, s.ev.GetSeq()))
	}
	require.Subset(t, []string{"a1", "a2", "b1", "a3"}, seqs)
	require.Equal(t, "a1", seqs[0])
	in.release(held)
	rest, held := in.take(ctx, 0, 3, 0, nil)
	require.Len(t, rest, 1)
	in.release(held)
}

// TestIntakeRoomBoundsQueued: a full intake makes streams wait, and a
// stream that ends stops waiting.
func TestIntakeRoomBoundsQueued(t *testing.T) {
	in := newIntake(1, 2, 1)
	require.True(t, in.enter(nil, nil))
	in.put(intakeSub("a", 1))
	require.True(t, in.enter(nil, nil))
	in.put(intakeSub("a", 2))
	done := make(chan struct{})
	entered := make(chan bool)
	go func() { entered <- in.enter(done, nil) }()
	select {
	case <-entered:
		t.Fatal("entered a full intake")
	case <-time.After(20 * time.Millisecond):
	}
	close(done)
	require.False(t, <-entered)

	batch, held := in.take(context.Background(), 0, 10, 0, nil)
	require.Len(t, batch, 2)
	require.True(t, in.enter(nil, nil), "taking makes room")
	in.release(held)
}
