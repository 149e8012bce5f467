package repotoken

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/taskrunner/taskrunner/platform/testkit"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/rpcretry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fakeService struct {
	taskrunnerv1.UnimplementedGitHubTokenServiceServer
	mu          sync.Mutex
	calls       int
	traceparent string
	err         error
	expiry      time.Time
}

func (f *fakeService) IssueRepoToken(ctx context.Context, req *taskrunnerv1.IssueRepoTokenRequest) (*taskrunnerv1.IssueRepoTokenResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get("traceparent")) > 0 {
		f.traceparent = md.Get("traceparent")[0]
	}
	if f.err != nil {
		return nil, f.err
	}
	return &taskrunnerv1.IssueRepoTokenResponse{
		Token: "ghs_token" + strings.Repeat("x", f.calls) + req.GetTaskId(), ExpireTime: timestamppb.New(f.expiry),
		Repo: "acme/greet", ApiBaseUrl: "https://api.example", GitBaseUrl: "https://git.example",
	}, nil
}

func dial(t *testing.T, svc *fakeService) *grpc.ClientConn {
	srv := grpc.NewServer()
	taskrunnerv1.RegisterGitHubTokenServiceServer(srv, svc)
	conn := testkit.ServeConn(t, srv)
	return conn
}

func TestGRPCAndCache(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	clock := now
	svc := &fakeService{expiry: now.Add(time.Hour)}
	var seen []string
	c := NewCached(NewGRPC(dial(t, svc), "t1", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
		func() time.Time { return clock }, func(tok Token) { seen = append(seen, tok.Value) })

	tok, err := c.Token(context.Background())
	require.NoError(t, err)
	require.Equal(t, "ghs_tokenxt1", tok.Value)
	require.Equal(t, "https://git.example/acme/greet.git", tok.CloneURL())
	require.Equal(t, "https://api.example", tok.APIBaseURL)
	require.NotContains(t, tok.String(), tok.Value)
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", svc.traceparent)

	clock = now.Add(54 * time.Minute) // 6 minutes left: cached
	again, err := c.Token(context.Background())
	require.NoError(t, err)
	require.Equal(t, tok.Value, again.Value)

	svc.expiry = clock.Add(time.Hour)
	clock = now.Add(56 * time.Minute) // 4 minutes left: asks again
	fresh, err := c.Token(context.Background())
	require.NoError(t, err)
	require.Equal(t, "ghs_tokenxxt1", fresh.Value)
	require.Equal(t, []string{"ghs_tokenxt1", "ghs_tokenxxt1"}, seen)
	require.Equal(t, 2, svc.calls)
}

func TestGRPCErrors(t *testing.T) {
	cases := []struct {
		err  error
		auth bool
		want string
	}{
		{status.Error(codes.PermissionDenied, "certificate is for another task"), true,
			"authentication failed: GitHubTokenService refused the token: PermissionDenied: certificate is for another task"},
		{status.Error(codes.Unauthenticated, "no client certificate"), true,
			"authentication failed: GitHubTokenService refused the task certificate: Unauthenticated: no client certificate"},
		{repoInaccessible(t, "the GitHub App cannot access acme/widgets: install it on the repository"), true,
			"authentication failed: GitHubTokenService answered that the GitHub App cannot access the repository: the GitHub App cannot access acme/widgets: install it on the repository"},
		{status.Error(codes.NotFound, "task not found"), false, "NotFound: task not found"},
	}
	for _, tc := range cases {
		t.Run(tc.want, func(t *testing.T) {
			g := NewGRPC(dial(t, &fakeService{err: tc.err}), "t1", "")
			_, err := g.Token(context.Background())
			require.ErrorContains(t, err, tc.want)
			require.Equal(t, tc.auth, errorsIs(err, ErrAuth))
		})
	}
}

// repoInaccessible is GitHubTokenService's answer for a repository the App cannot access.
func repoInaccessible(t *testing.T, msg string) error {
	st, err := status.New(codes.PermissionDenied, msg).WithDetails(&errdetails.ErrorInfo{Reason: ReasonRepoInaccessible, Domain: "taskrunner.dev"})
	require.NoError(t, err)
	return st.Err()
}

// flakyService fails IssueRepoToken with codes[i] on call i, then succeeds.
type flakyService struct {
	taskrunnerv1.UnimplementedGitHubTokenServiceServer
	mu    sync.Mutex
	calls int
	codes []codes.Code
}

func (f *flakyService) IssueRepoToken(context.Context, *taskrunnerv1.IssueRepoTokenRequest) (*taskrunnerv1.IssueRepoTokenResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.calls <= len(f.codes) {
		return nil, status.Error(f.codes[f.calls-1], "control plane restarting")
	}
	return &taskrunnerv1.IssueRepoTokenResponse{Token: "ghs_fresh", Repo: "acme/greet", GitBaseUrl: "https://git.example"}, nil
}

// TestGRPCRetriesThroughARestart: a control-plane restart answers Unavailable, then Internal
// and ResourceExhausted while its database comes back; the token still arrives (it used to
// fail the cloning task at the first Unavailable).
func TestGRPCRetriesThroughARestart(t *testing.T) {
	svc := &flakyService{codes: []codes.Code{codes.Unavailable, codes.Unavailable, codes.Internal, codes.ResourceExhausted, codes.DeadlineExceeded}}
	srv := grpc.NewServer()
	taskrunnerv1.RegisterGitHubTokenServiceServer(srv, svc)
	conn := testkit.ServeConn(t, srv)
	g := NewGRPC(conn, "t1", "")
	g.Retry = rpcretry.Policy{MinDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond}
	tok, err := g.Token(context.Background())
	require.NoError(t, err)
	require.Equal(t, "ghs_fresh", tok.Value)
	require.Equal(t, 6, svc.calls)
}

// TestGRPCRetriesWhileTheServiceIsDown: with no server listening for a while, the call waits
// and succeeds once the service is started, and a deadline ends it with the reason.
func TestGRPCRetriesWhileTheServiceIsDown(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close()) // down: connections are refused
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		rpcretry.DialOption(time.Millisecond, 50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	g := NewGRPC(conn, "t1", "")
	g.Retry = rpcretry.Policy{MinDelay: time.Millisecond, MaxDelay: 50 * time.Millisecond, AttemptTimeout: 100 * time.Millisecond}

	ctx, cancel := context.WithTimeoutCause(context.Background(), 300*time.Millisecond, errors.New("task deadline"))
	defer cancel()
	_, err = g.Token(ctx)
	require.ErrorContains(t, err, "GitHubTokenService.IssueRepoToken: ")
	require.ErrorContains(t, err, "gave up: task deadline")
	require.False(t, errorsIs(err, ErrAuth))

	type result struct {
		tok Token
		err error
	}
	got := make(chan result, 1)
	go func() {
		tok, err := g.Token(context.Background())
		got <- result{tok, err}
	}()
	lis, err = net.Listen("tcp", addr)
	require.NoError(t, err)
	srv := grpc.NewServer()
	taskrunnerv1.RegisterGitHubTokenServiceServer(srv, &flakyService{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	select {
	case r := <-got:
		require.NoError(t, r.err)
		require.Equal(t, "ghs_fresh", r.tok.Value)
	case <-time.After(10 * time.Second):
		t.Fatal("the token call did not recover when the service came back")
	}
}
