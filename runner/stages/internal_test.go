package stages

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/taskrunner/taskrunner/platform/redact"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

type memReporter struct {
	mu  sync.Mutex
	evs []*taskrunnerv1.Event
}

func (m *memReporter) Send(ev *taskrunnerv1.Event) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.evs = append(m.evs, ev)
	return int64(len(m.evs)), nil
}
func (m *memReporter) Cancelled() <-chan string { return nil }
func (m *memReporter) events() []*taskrunnerv1.Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]*taskrunnerv1.Event(nil), m.evs...)
}

func TestEmitterBatchesAndKeepsTheTail(t *testing.T) {
	rep := &memReporter{}
	red, err := redact.New(nil)
	require.NoError(t, err)
	// An hour-long interval: only the first call and explicit flushes send.
	e := newEmitter(rep, red, slog.New(slog.DiscardHandler), time.Hour, 5)
	explore := taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE
	e.lines(explore, "first \x1b[31mred\x1b[0m")
	for i := range 12 {
		e.lines(explore, "line "+strings.Repeat("x", i))
	}
	require.Len(t, rep.events(), 1, "one log event per interval")
	e.lines(explore, "token ghs_16C7e42F292c6912E7710c838347Ae178B4a")
	e.send(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Usage{Usage: &taskrunnerv1.Usage{CostUsd: 1}}})
	e.lines(taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE, "late")
	e.close()
	e.lines(explore, "after close")

	evs := rep.events()
	require.Len(t, evs, 4)
	require.Equal(t, []string{"first red"}, evs[0].GetLog().GetLines())
	require.Equal(t, []string{"… 8 earlier lines omitted", "line xxxxxxxx", "line xxxxxxxxx", "line xxxxxxxxxx", "line xxxxxxxxxxx", "token [REDACTED]"},
		evs[1].GetLog().GetLines(), "the newest lines are kept, pending lines go before the next event")
	require.NotNil(t, evs[2].GetUsage())
	require.Equal(t, []string{"late"}, evs[3].GetLog().GetLines())
	require.Equal(t, taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE, evs[3].GetLog().GetStage())
}

func TestEmitterTimerFlushes(t *testing.T) {
	rep := &memReporter{}
	red, _ := redact.New(nil)
	e := newEmitter(rep, red, slog.New(slog.DiscardHandler), 10*time.Millisecond, 0)
	defer e.close()
	e.lines(0, "a")
	e.lines(0, "b")
	require.Eventually(t, func() bool { return len(rep.events()) == 2 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, []string{"b"}, rep.events()[1].GetLog().GetLines())
}

func TestTracker(t *testing.T) {
	type step struct{ file, cmd, enter string }
	cases := []struct {
		name   string
		steps  []step
		want   []string // "stage/change" reported
		change string
	}{
		{
			name:  "boundaries only",
			steps: []step{{enter: "explore"}, {enter: "propose"}, {enter: "apply"}, {enter: "archive"}},
			want:  []string{"explore/", "propose/", "apply/", "archive/"},
		},
		{
			name: "the agent runs ahead: proposal written during explore, archive by command",
			steps: []step{{enter: "explore"}, {file: "openspec/changes/add-x/proposal.md"}, {enter: "propose"},
				{file: "src/main.go"}, {enter: "apply"}, {cmd: "cd /w && openspec archive add-x -y"}, {enter: "archive"}},
			want:   []string{"explore/", "propose/add-x", "apply/add-x", "archive/add-x"},
			change: "add-x",
		},
		{
			name:   "archive detected from the moved files",
			steps:  []step{{enter: "apply"}, {file: "/w/openspec/changes/archive/2026-11-29-add-y/tasks.md"}},
			want:   []string{"apply/", "archive/add-y"},
			change: "add-y",
		},
		{
			name:   "openspec new change names the change",
			steps:  []step{{enter: "propose"}, {cmd: "openspec new change add-z"}, {file: ".claude/x.md"}},
			want:   []string{"propose/"},
			change: "add-z",
		},
		{
			name:  "never backwards",
			steps: []step{{enter: "apply"}, {enter: "propose"}, {file: "openspec/changes/c/proposal.md"}},
			want:  []string{"apply/"},
		},
	}
	stage := map[string]taskrunnerv1.TaskStage{"explore": 1, "propose": 2, "apply": 3, "archive": 4}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			tr := &tracker{onEnter: func(s taskrunnerv1.TaskStage, c string) { got = append(got, StageName(s)+"/"+c) }}
			for _, s := range tc.steps {
				switch {
				case s.enter != "":
					tr.enter(stage[s.enter])
				case s.file != "":
					tr.fileTouched(s.file)
				default:
					tr.command(s.cmd)
				}
			}
			require.Equal(t, tc.want, got)
			if tc.change != "" {
				_, c := tr.current()
				require.Equal(t, tc.change, c)
			}
		})
	}
}

// TestEmitterSplitsABurstByBytes replays the agent turn that made a 108,747-byte log event
// (the server's limit is 64 KiB, and the refusal ended the runner's stream): one flush now
// sends several log events, each under the limit, with every line in order; an overlong line
// says how much of it was cut.
func TestEmitterSplitsABurstByBytes(t *testing.T) {
	rep := &memReporter{}
	red, err := redact.New(nil)
	require.NoError(t, err)
	e := newEmitter(rep, red, slog.New(slog.DiscardHandler), time.Hour, 0)
	var burst []string
	total := 0
	for i := 0; total < 108_747; i++ {
		l := fmt.Sprintf("%03d %s", i, strings.Repeat(`say "hi" \ `, 53))
		if total+len(l) > 108_747 {
			l = l[:108_747-total]
		}
		burst = append(burst, l)
		total += len(l)
	}
	long := strings.Repeat("ü", 1500) // 3,000 bytes
	e.lines(taskrunnerv1.TaskStage_TASK_STAGE_APPLY, append(burst, long)...)
	e.close()

	evs := rep.events()
	require.Greater(t, len(evs), 2, "several events")
	var got []string
	for _, ev := range evs {
		b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(ev)
		require.NoError(t, err)
		require.Less(t, len(b), 64<<10, "every event under the server's limit")
		require.Equal(t, taskrunnerv1.TaskStage_TASK_STAGE_APPLY, ev.GetLog().GetStage())
		got = append(got, ev.GetLog().GetLines()...)
	}
	require.Equal(t, burst, got[:len(burst)])
	require.Len(t, got, len(burst)+1)
	cut := got[len(burst)]
	require.LessOrEqual(t, len(cut), maxLogLineBytes)
	require.True(t, strings.HasPrefix(long, strings.Split(cut, "…")[0]))
	require.Regexp(t, `… \[truncated \d+ bytes\]$`, cut)
}
