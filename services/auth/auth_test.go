package auth_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/taskrunner/taskrunner/platform/testkit"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/rpcserver"
	"github.com/taskrunner/taskrunner/services/store/storetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}

// clock is a settable clock for expiry.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type env struct {
	store  *auth.Store
	clock  *clock
	client taskrunnerv1.TokenServiceClient
}

// newEnv serves TokenService behind the shared interceptor chain, with the
// store as the authenticator, on a real PostgreSQL.
func newEnv(t *testing.T) *env {
	t.Helper()
	db := storetest.NewDB(t)
	c := &clock{t: time.Now()}
	store := auth.NewStore(db.Pool, auth.WithClock(c.now))
	srv := rpcserver.New(rpcserver.Options{Logger: slog.New(slog.DiscardHandler), Auth: store})
	taskrunnerv1.RegisterTokenServiceServer(srv, auth.NewTokenServer(store))
	conn := testkit.ServeConn(t, srv)
	return &env{store: store, clock: c, client: taskrunnerv1.NewTokenServiceClient(conn)}
}

func as(tok string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok)
}

func requireCode(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	st, ok := status.FromError(err)
	require.True(t, ok, "not a status: %v", err)
	require.Equal(t, code, st.Code(), st.Message())
	require.Contains(t, st.Message(), msg)
}

func TestExpiredTokenIsRefusedOnTheNextCall(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	plain, tok, err := e.store.Issue(ctx, auth.TokenSpec{Owner: "alice", Name: "laptop", TTL: time.Hour})
	require.NoError(t, err)
	require.NotNil(t, tok.ExpiresAt)
	require.WithinDuration(t, e.clock.now().Add(time.Hour), *tok.ExpiresAt, time.Millisecond)

	p, err := e.store.Authenticate(ctx, plain)
	require.NoError(t, err)
	require.Equal(t, "alice", p.Owner)
	require.Equal(t, tok.ID, p.TokenID)

	e.clock.add(59 * time.Minute)
	_, err = e.client.ListTokens(as(plain), &taskrunnerv1.ListTokensRequest{})
	require.NoError(t, err)
	e.clock.add(time.Minute)
	_, err = e.client.ListTokens(as(plain), &taskrunnerv1.ListTokensRequest{})
	requireCode(t, err, codes.Unauthenticated, "bearer token expired")

	_, _, err = e.store.Issue(ctx, auth.TokenSpec{Owner: "alice", TTL: -time.Second})
	require.ErrorContains(t, err, "expires")
}

func TestRevokedTokenIsRefusedOnTheNextCall(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	alice, _, err := e.store.Issue(ctx, auth.TokenSpec{Owner: "alice", Name: "ci"})
	require.NoError(t, err)
	aliceLaptop, laptop, err := e.store.Issue(ctx, auth.TokenSpec{Owner: "alice", Name: "laptop"})
	require.NoError(t, err)
	bob, _, err := e.store.Issue(ctx, auth.TokenSpec{Owner: "bob", Name: "bob's"})
	require.NoError(t, err)

	// Another owner's token is NotFound, and stays usable.
	_, err = e.client.RevokeToken(as(bob), &taskrunnerv1.RevokeTokenRequest{Id: laptop.ID})
	requireCode(t, err, codes.NotFound, laptop.ID)
	_, err = e.client.ListTokens(as(aliceLaptop), &taskrunnerv1.ListTokensRequest{})
	require.NoError(t, err)
	_, err = e.client.RevokeToken(as(alice), &taskrunnerv1.RevokeTokenRequest{Id: "not-a-uuid"})
	requireCode(t, err, codes.NotFound, "not-a-uuid")

	resp, err := e.client.RevokeToken(as(alice), &taskrunnerv1.RevokeTokenRequest{Id: laptop.ID})
	require.NoError(t, err)
	require.Equal(t, laptop.ID, resp.GetToken().GetId())
	require.Equal(t, "laptop", resp.GetToken().GetName())
	require.NotNil(t, resp.GetToken().GetRevokeTime())
	revokedAt := resp.GetToken().GetRevokeTime().AsTime()

	_, err = e.client.ListTokens(as(aliceLaptop), &taskrunnerv1.ListTokensRequest{})
	requireCode(t, err, codes.Unauthenticated, "bearer token revoked")

	// Revoking again returns the token as it is.
	again, err := e.client.RevokeToken(as(alice), &taskrunnerv1.RevokeTokenRequest{Id: laptop.ID})
	require.NoError(t, err)
	require.True(t, revokedAt.Equal(again.GetToken().GetRevokeTime().AsTime()))

	// A token may revoke itself; the call that does it succeeds, the next fails.
	_, err = e.client.RevokeToken(as(bob), &taskrunnerv1.RevokeTokenRequest{Id: mustID(t, e, bob)})
	require.NoError(t, err)
	_, err = e.client.ListTokens(as(bob), &taskrunnerv1.ListTokensRequest{})
	requireCode(t, err, codes.Unauthenticated, "revoked")

	// The operator path (Store.Revoke) works on any owner's token.
	require.NoError(t, e.store.Revoke(ctx, mustID(t, e, alice)))
	_, err = e.store.Authenticate(ctx, alice)
	require.ErrorContains(t, err, "revoked")
	require.ErrorContains(t, e.store.Revoke(ctx, laptop.ID), "not found")
}

func mustID(t *testing.T, e *env, plain string) string {
	t.Helper()
	p, err := e.store.Authenticate(context.Background(), plain)
	require.NoError(t, err)
	return p.TokenID
}

func TestListTokensShowsOnlyTheCallersOwnerNewestFirst(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var names []string
	var caller string
	for i, name := range []string{"one", "two", "three", "four", "five"} {
		plain, _, err := e.store.Issue(ctx, auth.TokenSpec{Owner: "alice", Name: name, Description: "d-" + name, TTL: time.Duration(i+1) * time.Hour})
		require.NoError(t, err)
		names = append([]string{name}, names...)
		caller = plain
		e.clock.add(time.Second) // distinct creation times
	}
	_, _, err := e.store.Issue(ctx, auth.TokenSpec{Owner: "bob", Name: "bobs"})
	require.NoError(t, err)

	// A use is recorded.
	_, err = e.store.Authenticate(ctx, caller)
	require.NoError(t, err)

	var got []*taskrunnerv1.Token
	pageToken := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 3)
		resp, err := e.client.ListTokens(as(caller), &taskrunnerv1.ListTokensRequest{PageSize: 2, PageToken: pageToken})
		require.NoError(t, err)
		require.LessOrEqual(t, len(resp.GetTokens()), 2)
		got = append(got, resp.GetTokens()...)
		if pageToken = resp.GetNextPageToken(); pageToken == "" {
			break
		}
	}
	var gotNames []string
	for _, tk := range got {
		gotNames = append(gotNames, tk.GetName())
		require.Equal(t, "alice", tk.GetOwner())
		require.Equal(t, []string{auth.ScopeTasks}, tk.GetScopes())
		require.Equal(t, "d-"+tk.GetName(), tk.GetDescription())
		require.NotNil(t, tk.GetExpireTime())
		require.True(t, tk.GetExpireTime().AsTime().After(tk.GetCreateTime().AsTime()))
	}
	require.Equal(t, names, gotNames)
	require.NotNil(t, got[0].GetLastUseTime(), "the caller's token records its use")
	require.Nil(t, got[1].GetLastUseTime())

	// Revoked and expired tokens are hidden unless asked for.
	_, err = e.client.RevokeToken(as(caller), &taskrunnerv1.RevokeTokenRequest{Id: got[1].GetId()})
	require.NoError(t, err)
	resp, err := e.client.ListTokens(as(caller), &taskrunnerv1.ListTokensRequest{})
	require.NoError(t, err)
	require.Len(t, resp.GetTokens(), 4)
	e.clock.add(90 * time.Minute) // "one" (1h) expired
	resp, err = e.client.ListTokens(as(caller), &taskrunnerv1.ListTokensRequest{})
	require.NoError(t, err)
	require.Len(t, resp.GetTokens(), 3)
	resp, err = e.client.ListTokens(as(caller), &taskrunnerv1.ListTokensRequest{IncludeInactive: true})
	require.NoError(t, err)
	require.Len(t, resp.GetTokens(), 5)

	_, err = e.client.ListTokens(as(caller), &taskrunnerv1.ListTokensRequest{PageToken: "garbage"})
	requireCode(t, err, codes.InvalidArgument, "page_token")
	_, err = e.client.ListTokens(as(caller), &taskrunnerv1.ListTokensRequest{PageSize: 1000})
	requireCode(t, err, codes.InvalidArgument, "page_size")
	_, err = e.client.ListTokens(context.Background(), &taskrunnerv1.ListTokensRequest{})
	requireCode(t, err, codes.Unauthenticated, "missing bearer token")
}

func TestIssueValidates(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for name, spec := range map[string]auth.TokenSpec{
		"owner":  {Owner: " "},
		"scopes": {Owner: "a", Scopes: []string{"admin"}},
		"name":   {Owner: "a", Name: string(make([]byte, auth.MaxNameLen+1))},
	} {
		_, _, err := e.store.Issue(ctx, spec)
		require.ErrorContains(t, err, name+":", name)
	}
}

// TestRevokedElsewhereIsRefusedWithinASecond: a success is kept for a
// second (a connect storm reads the token once), so a token revoked by
// another process (another Store) is refused within that second, and one
// revoked through the same Store at once.
func TestRevokedElsewhereIsRefusedWithinASecond(t *testing.T) {
	db := storetest.NewDB(t)
	c := &clock{t: time.Now()}
	here := auth.NewStore(db.Pool, auth.WithClock(c.now))
	elsewhere := auth.NewStore(db.Pool, auth.WithClock(c.now))
	ctx := context.Background()
	plain, id, err := here.Create(ctx, "alice", nil, "laptop")
	require.NoError(t, err)
	_, err = here.Authenticate(ctx, plain)
	require.NoError(t, err)

	require.NoError(t, elsewhere.Revoke(ctx, id))
	c.add(500 * time.Millisecond)
	p, err := here.Authenticate(ctx, plain)
	require.NoError(t, err, "kept for up to a second")
	require.Equal(t, "alice", p.Owner)
	c.add(600 * time.Millisecond)
	_, err = here.Authenticate(ctx, plain)
	require.ErrorContains(t, err, "bearer token revoked")
	_, err = elsewhere.Authenticate(ctx, plain)
	require.ErrorContains(t, err, "bearer token revoked", "the revoking store forgot it at once")

	// Through the same store: refused on the very next call.
	plain2, id2, err := here.Create(ctx, "alice", nil, "desktop")
	require.NoError(t, err)
	_, err = here.Authenticate(ctx, plain2)
	require.NoError(t, err)
	require.NoError(t, here.Revoke(ctx, id2))
	_, err = here.Authenticate(ctx, plain2)
	require.ErrorContains(t, err, "bearer token revoked")
}
