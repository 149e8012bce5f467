package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/store"
)

func tokenCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Create, list and revoke API tokens",
		Example: `  taskctl token create --owner alice --name laptop --expires 720h
  taskctl token list
  taskctl token revoke 3f0c2a9e-8d1b-4c55-9f1e-2a7b6c5d4e3f`}
	cmd.AddCommand(tokenCreateCmd(g), tokenListCmd(g), tokenRevokeCmd(g))
	return cmd
}

// tokenCreateCmd writes to the database directly: creating a token is an
// operator's bootstrap step, not an RPC (see TokenService in token.proto).
func tokenCreateCmd(g *globals) *cobra.Command {
	var owner, name, scopes, desc string
	var expires time.Duration
	create := &cobra.Command{
		Use:   "create --owner NAME",
		Short: "Create an API token (printed once; only its hash is stored; needs the database)",
		Example: `  taskctl token create --owner alice --name laptop --expires 720h
  taskctl token create --owner gateway --name webhook --scopes internal --description "GitHub webhook receiver"
  taskctl token create --owner alice --name ci --json   # {"token": {...}, "secret": "trt_…"}`,
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
			plain, tok, err := auth.NewStore(pool).Issue(ctx, auth.TokenSpec{Owner: owner, Name: name, Scopes: sc, Description: desc, TTL: expires})
			if err != nil {
				return err
			}
			if g.json {
				// The token resource as TokenService returns it, plus the
				// secret, which exists only here.
				b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(auth.TokenProto(tok))
				if err != nil {
					return err
				}
				enc := json.NewEncoder(g.out)
				enc.SetIndent("", "  ")
				return enc.Encode(struct {
					Token  json.RawMessage `json:"token"`
					Secret string          `json:"secret"`
				}{b, plain})
			}
			fmt.Fprintf(g.out, "%s\n", plain)
			exp := "never expires"
			if tok.ExpiresAt != nil {
				exp = "expires " + tok.ExpiresAt.Local().Format(time.DateTime)
			}
			fmt.Fprintf(os.Stderr, "token %s (%q) for owner %q created, %s; it is shown only once\n", tok.ID, tok.Name, tok.Owner, exp)
			return nil
		},
	}
	create.Flags().StringVar(&owner, "owner", "", "owner of the token (required)")
	create.Flags().StringVar(&name, "name", "", "name to tell the token apart, e.g. laptop or ci")
	create.Flags().StringVar(&scopes, "scopes", auth.ScopeTasks, "comma-separated scopes: tasks, internal")
	create.Flags().StringVar(&desc, "description", "", "what the token is for")
	create.Flags().DurationVar(&expires, "expires", 0, "lifetime, e.g. 720h (0: never expires)")
	_ = create.MarkFlagRequired("owner")
	return create
}

func tokenListCmd(g *globals) *cobra.Command {
	var all bool
	var pageSize int32
	var pageToken string
	list := &cobra.Command{
		Use:   "list",
		Short: "List your tokens (those of your token's owner), newest first",
		Example: `  taskctl token list
  taskctl token list --all          # also revoked and expired tokens
  taskctl token list --json         # {"tokens": [...], "next_page_token": ""}, as GET /v1/tokens`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			conn, ctx, err := g.conn(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			resp, err := taskrunnerv1.NewTokenServiceClient(conn).ListTokens(ctx,
				&taskrunnerv1.ListTokensRequest{PageSize: pageSize, PageToken: pageToken, IncludeInactive: all})
			if err != nil {
				return err
			}
			if g.json {
				return writeProto(g.out, resp)
			}
			now := time.Now()
			tw := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tSCOPES\tCREATED\tLAST USED\tEXPIRES\tSTATE")
			for _, t := range resp.GetTokens() {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.GetId(), or(t.GetName(), "-"), strings.Join(t.GetScopes(), ","),
					when(t.GetCreateTime(), "-"), when(t.GetLastUseTime(), "never"), when(t.GetExpireTime(), "never"), tokenState(t, now))
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
	list.Flags().BoolVar(&all, "all", false, "also list revoked and expired tokens")
	list.Flags().Int32Var(&pageSize, "page-size", 50, "tokens per page (at most 100)")
	list.Flags().StringVar(&pageToken, "page-token", "", "page token from a previous list")
	return list
}

func tokenRevokeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke one of your tokens; it is refused from its next call on",
		Example: `  taskctl token revoke 3f0c2a9e-8d1b-4c55-9f1e-2a7b6c5d4e3f
  taskctl token revoke 3f0c2a9e-8d1b-4c55-9f1e-2a7b6c5d4e3f --json   # {"token": {...}}, as POST /v1/tokens/{id}:revoke`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			conn, ctx, err := g.conn(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			resp, err := taskrunnerv1.NewTokenServiceClient(conn).RevokeToken(ctx, &taskrunnerv1.RevokeTokenRequest{Id: args[0]})
			if err != nil {
				return err
			}
			if g.json {
				return writeProto(g.out, resp)
			}
			t := resp.GetToken()
			fmt.Fprintf(g.out, "token %s (%s) revoked at %s\n", t.GetId(), or(t.GetName(), "unnamed"), when(t.GetRevokeTime(), "-"))
			return nil
		},
	}
}

func tokenState(t *taskrunnerv1.Token, now time.Time) string {
	switch {
	case t.GetRevokeTime() != nil:
		return "revoked"
	case t.GetExpireTime() != nil && !now.Before(t.GetExpireTime().AsTime()):
		return "expired"
	}
	return "active"
}

func when(ts *timestamppb.Timestamp, unset string) string {
	if ts == nil {
		return unset
	}
	return ts.AsTime().Local().Format(time.DateTime)
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
