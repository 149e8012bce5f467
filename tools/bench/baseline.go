package bench

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/taskrunner/taskrunner/platform/eventwire"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// The baseline is a faithful small model of the design the runner
// protocol replaces: the runner POSTs every event as signed JSON and waits
// for the answer before sending the next; the handler checks the
// signature, inserts one row in autocommit (one fsync per event with
// synchronous_commit on) and publishes it to the same Redis channel the
// Events service uses, so the same SSE handler serves both designs.
const (
	baselinePath    = "/v1/callbacks/events"
	signatureHeader = "X-Taskrunner-Signature"
	timestampHeader = "X-Taskrunner-Timestamp"
	maxClockSkew    = 5 * time.Minute
	insertEventSQL  = `INSERT INTO task_events (task_id, seq, runner_seq, type, payload) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (task_id, seq) DO NOTHING`
	// A task's timeline starts with the control plane's events of its
	// creation; the baseline (which predates the timeline) numbers the
	// runner's events after them.
	controlPlaneSQL = `SELECT count(*) FROM task_events WHERE task_id = $1 AND runner_seq IS NULL`
)

// Sign is the baseline's request signature: "sha256=" and the hex
// HMAC-SHA256 of "<unix timestamp>.<body>" under the task's secret.
func Sign(secret []byte, ts int64, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(strconv.FormatInt(ts, 10)))
	m.Write([]byte{'.'})
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Verify checks sig against Sign's result in constant time.
func Verify(secret []byte, ts int64, body []byte, sig string) bool {
	return hmac.Equal([]byte(sig), []byte(Sign(secret, ts, body)))
}

// callbackSecret derives a task's callback secret from the server's key,
// as the old dispatcher handed one to each sandbox.
func callbackSecret(key []byte, taskID string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(taskID))
	return m.Sum(nil)
}

// callback is the baseline's request body.
type callback struct {
	TaskID string          `json:"task_id"`
	Event  json.RawMessage `json:"event"` // protojson of taskrunnerv1.Event
}

// BaselineServer is the old design's callback receiver.
type BaselineServer struct {
	key    []byte
	pool   *pgxpool.Pool
	rdb    redis.UniversalClient
	prefix string
	log    *slog.Logger

	offsets sync.Map // task id → control-plane events before the runner's
}

func (s *BaselineServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != baselinePath {
		http.NotFound(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil {
		http.Error(w, "read body", http.StatusBadRequest)
		return
	}
	ts, err := strconv.ParseInt(r.Header.Get(timestampHeader), 10, 64)
	if err != nil || time.Since(time.Unix(ts, 0)).Abs() > maxClockSkew {
		http.Error(w, "bad or stale timestamp", http.StatusUnauthorized)
		return
	}
	// The signature covers the task id, so parse just enough to find the
	// secret, then verify before trusting anything else.
	var cb callback
	if err := json.Unmarshal(body, &cb); err != nil || cb.TaskID == "" {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	if !Verify(callbackSecret(s.key, cb.TaskID), ts, body, r.Header.Get(signatureHeader)) {
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	ev, err := eventwire.DecodeEvent(cb.Event)
	if err != nil || ev.GetSeq() < 1 || eventwire.TypeName(ev) == "" {
		http.Error(w, "bad event", http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	runnerSeq := ev.GetSeq()
	off, err := s.offset(ctx, cb.TaskID)
	if err != nil {
		http.Error(w, "store", http.StatusInternalServerError)
		return
	}
	ev.Seq += off
	payload, err := eventwire.EncodeEvent(ev)
	if err != nil {
		http.Error(w, "encode", http.StatusInternalServerError)
		return
	}
	if _, err := s.pool.Exec(ctx, insertEventSQL, cb.TaskID, ev.GetSeq(), runnerSeq, eventwire.TypeName(ev), payload); err != nil {
		s.log.Warn("baseline: insert failed", "error", err)
		http.Error(w, "store", http.StatusInternalServerError)
		return
	}
	if err := s.rdb.Publish(ctx, eventwire.Channel(s.prefix, cb.TaskID), eventwire.EncodeMessage(ev.GetSeq(), eventwire.TypeName(ev), false, payload)).Err(); err != nil {
		s.log.Warn("baseline: publish failed", "error", err)
	}
	w.WriteHeader(http.StatusNoContent)
}

func (e *Env) startBaseline() error {
	e.Baseline = &BaselineServer{key: []byte(randomHex(32)), pool: e.basePool, rdb: e.Redis, prefix: e.Prefix, log: e.log}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: e.Baseline, TLSConfig: e.baseTLS, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.ServeTLS(ln, "", "") }()
	e.closeFns = append(e.closeFns, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
	})
	e.BaseAddr = ln.Addr().String()
	return nil
}

// baselineClient is one runner of the old design.
type baselineClient struct {
	http   *http.Client
	url    string
	taskID string
	secret []byte
}

// post sends one event and waits for the answer (with two retries on a
// transport error, as the old runner did).
func (c *baselineClient) post(ctx context.Context, ev *taskrunnerv1.Event) error {
	raw, err := eventwire.EncodeEvent(ev)
	if err != nil {
		return err
	}
	body, err := json.Marshal(callback{TaskID: c.taskID, Event: raw})
	if err != nil {
		return err
	}
	var last error
	for range 3 {
		ts := time.Now().Unix()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(timestampHeader, strconv.FormatInt(ts, 10))
		req.Header.Set(signatureHeader, Sign(c.secret, ts, body))
		resp, err := c.http.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			last = err
			continue
		}
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		_ = resp.Body.Close()
		if resp.StatusCode/100 == 2 {
			return nil
		}
		return fmt.Errorf("baseline: %s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	return last
}

// offset is the number of control-plane events at the start of a task's
// timeline, read once per task.
func (s *BaselineServer) offset(ctx context.Context, taskID string) (int64, error) {
	if v, ok := s.offsets.Load(taskID); ok {
		return v.(int64), nil
	}
	var n int64
	if err := s.pool.QueryRow(ctx, controlPlaneSQL, taskID).Scan(&n); err != nil {
		return 0, err
	}
	s.offsets.Store(taskID, n)
	return n, nil
}
