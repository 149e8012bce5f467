package main

import (
	"context"
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
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/store"
	"github.com/taskrunner/taskrunner/services/telemetry"
)

type globals struct {
	addr, token, databaseURL string
	json                     bool
	out                      io.Writer
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

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func newRoot(out io.Writer) *cobra.Command {
	g := &globals{out: out}
	root := &cobra.Command{
		Use:           "taskctl",
		Short:         "Manage taskrunner tasks, tokens and development certificates",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.addr, "addr", envOr("TASKRUNNER_ADDR", "127.0.0.1:7070"), "TaskService gRPC address (TASKRUNNER_ADDR)")
	root.PersistentFlags().StringVar(&g.token, "token", os.Getenv("TASKRUNNER_TOKEN"), "API bearer token (TASKRUNNER_TOKEN)")
	root.PersistentFlags().StringVar(&g.databaseURL, "database-url", envOr("TASKRUNNER_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/taskrunner?sslmode=disable"), "PostgreSQL URL for token create (TASKRUNNER_DATABASE_URL)")
	root.PersistentFlags().BoolVar(&g.json, "json", false, "print JSON")
	root.AddCommand(tokenCmd(g), taskCmd(g), pkiCmd(g))
	return root
}

func tokenCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "API tokens"}
	var owner, scopes, desc string
	create := &cobra.Command{
		Use:   "create --owner NAME",
		Short: "Create an API token (printed once; only its hash is stored)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := store.Open(ctx, g.databaseURL)
			if err != nil {
				return err
			}
			defer pool.Close()
			var sc []string
			for _, s := range strings.Split(scopes, ",") {
				if s = strings.TrimSpace(s); s != "" {
					sc = append(sc, s)
				}
			}
			plain, id, err := auth.NewStore(pool).Create(ctx, owner, sc, desc)
			if err != nil {
				return err
			}
			if g.json {
				return writeJSONMap(g.out, map[string]any{"id": id, "owner": owner, "token": plain, "scopes": sc})
			}
			fmt.Fprintf(g.out, "%s\n", plain)
			fmt.Fprintf(os.Stderr, "token %s for owner %q created; it is shown only once\n", id, owner)
			return nil
		},
	}
	create.Flags().StringVar(&owner, "owner", "", "owner of the token (required)")
	create.Flags().StringVar(&scopes, "scopes", auth.ScopeTasks, "comma-separated scopes: tasks, internal")
	create.Flags().StringVar(&desc, "description", "", "what the token is for")
	_ = create.MarkFlagRequired("owner")
	cmd.AddCommand(create)
	return cmd
}

func (g *globals) client(ctx context.Context) (taskrunnerv1.TaskServiceClient, context.Context, func(), error) {
	if g.token == "" {
		return nil, nil, nil, errors.New("no API token: pass --token or set TASKRUNNER_TOKEN (create one with `taskctl token create --owner NAME`)")
	}
	conn, err := grpc.NewClient(g.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler()))
	if err != nil {
		return nil, nil, nil, err
	}
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+g.token)
	return taskrunnerv1.NewTaskServiceClient(conn), ctx, func() { _ = conn.Close() }, nil
}

func taskCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "task", Short: "Create, inspect and control tasks"}

	var repo, base, prompt, agent, requestID string
	var dispatch bool
	create := &cobra.Command{
		Use:   "create --repo OWNER/NAME --prompt TEXT",
		Short: "Create a task",
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
			resp, err := c.CreateTask(ctx, &taskrunnerv1.CreateTaskRequest{Repo: repo, BaseBranch: base, Prompt: prompt, Agent: a, RequestId: requestID, Dispatch: dispatch})
			if err != nil {
				return err
			}
			return g.printTask(resp.GetTask())
		},
	}
	create.Flags().StringVar(&repo, "repo", "", "repository as owner/name")
	create.Flags().StringVar(&base, "base", "main", "base branch")
	create.Flags().StringVar(&prompt, "prompt", "", "what the agent should do")
	create.Flags().StringVar(&agent, "agent", "claude", "agent: claude or codex")
	create.Flags().StringVar(&requestID, "request-id", "", "idempotency key")
	create.Flags().BoolVar(&dispatch, "dispatch", false, "dispatch right away")

	get := &cobra.Command{
		Use: "get ID", Short: "Show a task", Args: cobra.ExactArgs(1),
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
			return g.printTask(resp.GetTask())
		},
	}

	var st, frepo, pageToken string
	var pageSize int32
	list := &cobra.Command{
		Use: "list", Short: "List your tasks, newest first",
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
			return g.printTask(resp.GetTask())
		},
	}
	cancel.Flags().StringVar(&reason, "reason", "", "why")

	retry := &cobra.Command{
		Use: "retry ID", Short: "Create a new task retrying a failed or cancelled one", Args: cobra.ExactArgs(1),
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
			return g.printTask(resp.GetTask())
		},
	}
	dispatchCmd := &cobra.Command{
		Use: "dispatch ID", Short: "Start a sandbox for a task", Args: cobra.ExactArgs(1),
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
			return g.printTask(resp.GetTask())
		},
	}
	cmd.AddCommand(create, get, list, cancel, retry, dispatchCmd, watchCmd(g))
	return cmd
}

func pkiCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "pki", Short: "Development certificates"}
	var dir, trustDomain, hosts string
	initCmd := &cobra.Command{
		Use:   "init",
		Short: "Create a development runner CA and a server certificate (idempotent)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			var hs []string
			for _, h := range strings.Split(hosts, ",") {
				if h = strings.TrimSpace(h); h != "" {
					hs = append(hs, h)
				}
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
	initCmd.Flags().StringVar(&trustDomain, "trust-domain", envOr("TASKRUNNER_TRUST_DOMAIN", "taskrunner.local"), "SPIFFE trust domain")
	initCmd.Flags().StringVar(&hosts, "hosts", strings.Join(pki.DefaultDevHosts, ","), "server certificate hosts")
	cmd.AddCommand(initCmd)
	return cmd
}

func (g *globals) printTask(t *taskrunnerv1.Task) error {
	if g.json {
		return writeProto(g.out, t)
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
	row("pr", t.GetPrUrl())
	row("reason", t.GetFailedReason())
	row("retry of", t.GetRetryOf())
	row("trace", t.GetTraceId())
	row("created", t.GetCreateTime().AsTime().Local().Format(time.DateTime))
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
