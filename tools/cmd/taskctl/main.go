package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/taskrunner/taskrunner/platform/telemetry"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/pki"
)

// globals are the flags every command shares. Flags that default to an
// environment variable are resolved in resolve, after parsing, so that
// --help never prints the variable's value (a token or a database password).
type globals struct {
	addr, token, databaseURL, caFile string
	tls, json                        bool
	out                              io.Writer
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if tel, err := telemetry.Setup(ctx, "taskctl"); err == nil {
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = tel.Shutdown(sctx)
		}()
	}
	if err := newRoot(os.Stdout).ExecuteContext(ctx); err != nil {
		var oe *outcomeError
		if errors.As(err, &oe) {
			os.Exit(oe.code)
		}
		if st, ok := status.FromError(err); ok {
			fmt.Fprintf(os.Stderr, "taskctl: %s: %s\n", st.Code(), st.Message())
		} else {
			fmt.Fprintln(os.Stderr, "taskctl:", err)
		}
		os.Exit(1)
	}
}

// Defaults used when neither the flag nor its environment variable is set.
const (
	defaultAddr        = "127.0.0.1:7070"
	defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/taskrunner?sslmode=disable"
)

// envFlags maps flags to the environment variables they fall back to.
var envFlags = []struct{ flag, env string }{
	{"addr", "TASKRUNNER_ADDR"},
	{"token", "TASKRUNNER_TOKEN"},
	{"database-url", "TASKRUNNER_DATABASE_URL"},
	{"ca", "TASKRUNNER_GRPC_CA_FILE"},
}

// resolve fills the flags that were not given from the environment, then
// from the defaults.
func (g *globals) resolve(cmd *cobra.Command) {
	targets := map[string]*string{"addr": &g.addr, "token": &g.token, "database-url": &g.databaseURL, "ca": &g.caFile}
	for _, f := range envFlags {
		if !cmd.Flags().Changed(f.flag) {
			if v := os.Getenv(f.env); v != "" {
				*targets[f.flag] = v
			}
		}
	}
	if !cmd.Flags().Changed("tls") && os.Getenv("TASKRUNNER_GRPC_TLS") == "true" {
		g.tls = true
	}
	if g.addr == "" {
		g.addr = defaultAddr
	}
	if g.databaseURL == "" {
		g.databaseURL = defaultDatabaseURL
	}
}

func newRoot(out io.Writer) *cobra.Command {
	g := &globals{out: out}
	root := &cobra.Command{
		Use:   "taskctl",
		Short: "Manage taskrunner tasks, tokens and development certificates",
		Example: `  export TASKRUNNER_TOKEN=$(taskctl token create --owner alice --name laptop --expires 720h)
  taskctl task create --repo acme/widgets --prompt "Add a --farewell flag" --dispatch
  taskctl task list --status running --json
  taskctl --addr taskrunner.example.com:7070 --ca ca.pem task list`,
		SilenceUsage:     true,
		SilenceErrors:    true,
		PersistentPreRun: func(cmd *cobra.Command, _ []string) { g.resolve(cmd) },
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.addr, "addr", "", "taskrunnerd public gRPC address (env TASKRUNNER_ADDR; default "+defaultAddr+")")
	pf.StringVar(&g.token, "token", "", "API bearer token (env TASKRUNNER_TOKEN)")
	pf.StringVar(&g.databaseURL, "database-url", "", "PostgreSQL URL, for token create only (env TASKRUNNER_DATABASE_URL; default postgres://postgres@127.0.0.1:5432/taskrunner)")
	pf.StringVar(&g.caFile, "ca", "", "PEM CA bundle: dial --addr with TLS and verify the server against it (env TASKRUNNER_GRPC_CA_FILE; default plaintext)")
	pf.BoolVar(&g.tls, "tls", false, "dial --addr with TLS, verifying the server against the system roots (env TASKRUNNER_GRPC_TLS=true)")
	pf.BoolVar(&g.json, "json", false, "print JSON, in the shape of the REST API's responses (proto field names)")
	root.AddCommand(tokenCmd(g), taskCmd(g), pkiCmd(g))
	return root
}

// dial connects to --addr: plaintext by default (local development), TLS
// with --tls or --ca.
func (g *globals) dial() (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if g.tls || g.caFile != "" {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if g.caFile != "" {
			pem, err := os.ReadFile(g.caFile)
			if err != nil {
				return nil, fmt.Errorf("--ca: %w", err)
			}
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--ca: no PEM certificate in %s", g.caFile)
			}
		}
		creds = credentials.NewTLS(cfg)
	}
	return grpc.NewClient(g.addr, grpc.WithTransportCredentials(creds), grpc.WithStatsHandler(otelgrpc.NewClientHandler()))
}

// conn dials and returns a context that carries the bearer token.
func (g *globals) conn(ctx context.Context) (*grpc.ClientConn, context.Context, error) {
	if g.token == "" {
		return nil, nil, errors.New("no API token: pass --token or set TASKRUNNER_TOKEN (create one with `taskctl token create --owner NAME`)")
	}
	conn, err := g.dial()
	if err != nil {
		return nil, nil, err
	}
	return conn, metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+g.token), nil
}

func (g *globals) client(ctx context.Context) (taskrunnerv1.TaskServiceClient, context.Context, func(), error) {
	conn, ctx, err := g.conn(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	return taskrunnerv1.NewTaskServiceClient(conn), ctx, func() { _ = conn.Close() }, nil
}

func taskCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "task", Short: "Create, inspect and control tasks",
		Example: `  taskctl task create --repo acme/widgets --prompt "Fix the flaky test" --dispatch
  taskctl task list --status running
  taskctl task watch 0b7c6a4e-5a1f-4b8e-9a57-4f1c2d3e4f50`}

	var repo, base, prompt, agent, requestID string
	var dispatch bool
	var budget float64
	create := &cobra.Command{
		Use:   "create --repo OWNER/NAME --prompt TEXT",
		Short: "Create a task",
		Example: `  taskctl task create --repo acme/widgets --prompt "Add a --farewell flag"
  taskctl task create --repo acme/widgets --base develop --agent codex --prompt "Fix the flaky test" --dispatch
  taskctl task create --repo acme/widgets --prompt "Tidy the README" --max-budget-usd 0.50
  taskctl task create --repo acme/widgets --prompt "$(cat prompt.md)" --request-id farewell-1 --json   # {"task": {...}}, as POST /v1/tasks`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, ctx, done, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			a := taskrunnerv1.Agent_AGENT_UNSPECIFIED
			switch strings.ToLower(agent) {
			case "", "claude":
				a = taskrunnerv1.Agent_AGENT_CLAUDE
			case "codex":
				a = taskrunnerv1.Agent_AGENT_CODEX
			default:
				return fmt.Errorf("--agent: unknown agent %q (want claude or codex)", agent)
			}
			resp, err := c.CreateTask(ctx, &taskrunnerv1.CreateTaskRequest{Repo: repo, BaseBranch: base, Prompt: prompt, Agent: a, RequestId: requestID, Dispatch: dispatch, MaxBudgetUsd: budget})
			if err != nil {
				return err
			}
			return g.printTask(resp, resp.GetTask())
		},
	}
	create.Flags().StringVar(&repo, "repo", "", "repository as owner/name")
	create.Flags().StringVar(&base, "base", "main", "base branch")
	create.Flags().StringVar(&prompt, "prompt", "", "what the agent should do")
	create.Flags().StringVar(&agent, "agent", "claude", "agent: claude or codex")
	create.Flags().StringVar(&requestID, "request-id", "", "idempotency key")
	create.Flags().BoolVar(&dispatch, "dispatch", false, "dispatch right away")
	create.Flags().Float64Var(&budget, "max-budget-usd", 0, "most the task may spend on model calls (0: the server's maximum, which also bounds it)")

	get := &cobra.Command{
		Use: "get ID", Short: "Show a task", Args: cobra.ExactArgs(1),
		Example: `  taskctl task get 0b7c6a4e-5a1f-4b8e-9a57-4f1c2d3e4f50
  taskctl task get 0b7c6a4e-5a1f-4b8e-9a57-4f1c2d3e4f50 --json   # {"task": {...}}, as GET /v1/tasks/{id}`,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.GetTask(ctx, &taskrunnerv1.GetTaskRequest{Id: args[0]})
			if err != nil {
				return err
			}
			return g.printTask(resp, resp.GetTask())
		},
	}

	var st, frepo, pageToken string
	var pageSize int32
	list := &cobra.Command{
		Use: "list", Short: "List your tasks, newest first",
		Example: `  taskctl task list
  taskctl task list --status awaiting_review --repo acme/widgets
  taskctl task list --page-size 50 --json   # {"tasks": [...], "next_page_token": ""}, as GET /v1/tasks`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, ctx, done, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.ListTasks(ctx, &taskrunnerv1.ListTasksRequest{Status: st, Repo: frepo, PageSize: pageSize, PageToken: pageToken})
			if err != nil {
				return err
			}
			if g.json {
				return writeProto(g.out, resp)
			}
			tw := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATUS\tSTAGE\tREPO\tCREATED\tPROMPT")
			for _, t := range resp.GetTasks() {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.GetId(), short(t.GetStatus().String(), "TASK_STATUS_"),
					stageName(t.GetStage()), t.GetRepo(), t.GetCreateTime().AsTime().Local().Format(time.DateTime), clip(t.GetPrompt(), 40))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if resp.GetNextPageToken() != "" {
				fmt.Fprintf(g.out, "more: --page-token %s\n", resp.GetNextPageToken())
			}
			return nil
		},
	}
	list.Flags().StringVar(&st, "status", "", "only this status (proposing, queued, running, awaiting_review, done, failed, cancelled)")
	list.Flags().StringVar(&frepo, "repo", "", "only this repository")
	list.Flags().Int32Var(&pageSize, "page-size", 20, "tasks per page")
	list.Flags().StringVar(&pageToken, "page-token", "", "page token from a previous list")

	var reason string
	cancel := &cobra.Command{
		Use: "cancel ID", Short: "Cancel a task", Args: cobra.ExactArgs(1),
		Example: `  taskctl task cancel 0b7c6a4e-5a1f-4b8e-9a57-4f1c2d3e4f50 --reason "wrong repository"`,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.CancelTask(ctx, &taskrunnerv1.CancelTaskRequest{Id: args[0], Reason: reason})
			if err != nil {
				return err
			}
			return g.printTask(resp, resp.GetTask())
		},
	}
	cancel.Flags().StringVar(&reason, "reason", "", "why")

	retry := &cobra.Command{
		Use: "retry ID", Short: "Create a new task retrying a failed or cancelled one", Args: cobra.ExactArgs(1),
		Example: `  taskctl task retry 0b7c6a4e-5a1f-4b8e-9a57-4f1c2d3e4f50
  taskctl task retry 0b7c6a4e-5a1f-4b8e-9a57-4f1c2d3e4f50 --json | jq -r .task.id`,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.RetryTask(ctx, &taskrunnerv1.RetryTaskRequest{Id: args[0]})
			if err != nil {
				return err
			}
			return g.printTask(resp, resp.GetTask())
		},
	}
	dispatchCmd := &cobra.Command{
		Use: "dispatch ID", Short: "Start a sandbox for a task", Args: cobra.ExactArgs(1),
		Example: `  taskctl task dispatch 0b7c6a4e-5a1f-4b8e-9a57-4f1c2d3e4f50
  taskctl task dispatch 0b7c6a4e-5a1f-4b8e-9a57-4f1c2d3e4f50 --json | jq -r .task.status`,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.DispatchTask(ctx, &taskrunnerv1.DispatchTaskRequest{Id: args[0]})
			if err != nil {
				return err
			}
			return g.printTask(resp, resp.GetTask())
		},
	}
	cmd.AddCommand(create, get, list, cancel, retry, dispatchCmd, followupCmd(g), watchCmd(g))
	return cmd
}

func pkiCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "pki", Short: "Development certificates",
		Example: `  taskctl pki init --dir .dev/pki`}
	var dir, trustDomain, hosts string
	initCmd := &cobra.Command{
		Use:   "init",
		Short: "Create a development runner CA and a server certificate (idempotent)",
		Example: `  taskctl pki init
  taskctl pki init --dir .dev/pki --hosts localhost,127.0.0.1,taskrunner.internal --trust-domain example.org`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var hs []string
			for _, h := range strings.Split(hosts, ",") {
				if h = strings.TrimSpace(h); h != "" {
					hs = append(hs, h)
				}
			}
			if trustDomain == "" {
				trustDomain = cmp.Or(os.Getenv("TASKRUNNER_TRUST_DOMAIN"), "taskrunner.local")
			}
			p, err := pki.InitDev(dir, trustDomain, hs)
			if err != nil {
				return err
			}
			if g.json {
				return writeJSONMap(g.out, map[string]any{"ca_cert": p.CACert, "ca_key": p.CAKey, "server_cert": p.ServerCert, "server_key": p.ServerKey})
			}
			fmt.Fprintf(g.out, "CA:     %s\nserver: %s\n", p.CACert, p.ServerCert)
			return nil
		},
	}
	initCmd.Flags().StringVar(&dir, "dir", ".dev/pki", "directory for the certificates")
	initCmd.Flags().StringVar(&trustDomain, "trust-domain", "", "SPIFFE trust domain (env TASKRUNNER_TRUST_DOMAIN; default taskrunner.local)")
	initCmd.Flags().StringVar(&hosts, "hosts", strings.Join(pki.DefaultDevHosts, ","), "server certificate hosts")
	cmd.AddCommand(initCmd)
	return cmd
}

// printTask prints a task; with --json, the whole response message, which is
// what the REST API returns for the same call ({"task": {...}}).
func (g *globals) printTask(resp proto.Message, t *taskrunnerv1.Task) error {
	if g.json {
		return writeProto(g.out, resp)
	}
	tw := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s:\t%s\n", k, v)
		}
	}
	row("id", t.GetId())
	row("status", short(t.GetStatus().String(), "TASK_STATUS_"))
	if t.GetStage() != taskrunnerv1.TaskStage_TASK_STAGE_UNSPECIFIED {
		row("stage", short(t.GetStage().String(), "TASK_STAGE_"))
	}
	row("repo", t.GetRepo())
	row("base", t.GetBaseBranch())
	row("branch", t.GetHeadBranch())
	row("agent", short(t.GetAgent().String(), "AGENT_"))
	row("prompt", clip(t.GetPrompt(), 100))
	if d := t.GetDiffStats(); d.GetFilesChanged() > 0 {
		row("diff", fmt.Sprintf("+%d -%d in %d files", d.GetAdditions(), d.GetDeletions(), d.GetFilesChanged()))
	}
	if u := t.GetUsage(); u.GetCostUsd() > 0 {
		row("cost", fmt.Sprintf("$%.4f (%d in / %d out tokens)", u.GetCostUsd(), u.GetTokensIn(), u.GetTokensOut()))
	}
	if b := t.GetMaxBudgetUsd(); b > 0 {
		row("budget", fmt.Sprintf("$%.2f", b))
	}
	if q := t.GetOwnerQuota(); q != nil {
		row("today", fmt.Sprintf("$%.2f of the owner's daily $%.2f (resets %s)", q.GetSpentTodayUsd(), q.GetDailyUsd(),
			q.GetResetsTime().AsTime().Local().Format(time.DateTime)))
	}
	row("pr", t.GetPrUrl())
	row("reason", t.GetFailedReason())
	row("retry of", t.GetRetryOf())
	row("trace", t.GetTraceId())
	row("created", t.GetCreateTime().AsTime().Local().Format(time.DateTime))
	printRuns(row, t)
	return tw.Flush()
}

func stageName(s taskrunnerv1.TaskStage) string {
	if s == taskrunnerv1.TaskStage_TASK_STAGE_UNSPECIFIED {
		return "-"
	}
	return short(s.String(), "TASK_STAGE_")
}

func short(s, prefix string) string { return strings.ToLower(strings.TrimPrefix(s, prefix)) }

func clip(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

func writeProto(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true, Multiline: true}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

func writeJSONMap(w io.Writer, v map[string]any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
