package auth

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/timestamppb"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/errs"
)

// TokenServer is TokenService: a caller lists and revokes the tokens of its
// own owner. Any authenticated caller may (a tasks-scope token can revoke
// itself); nobody sees another owner's tokens.
type TokenServer struct {
	taskrunnerv1.UnimplementedTokenServiceServer
	store *Store
}

var _ taskrunnerv1.TokenServiceServer = (*TokenServer)(nil)

// NewTokenServer returns TokenService on store.
func NewTokenServer(store *Store) *TokenServer { return &TokenServer{store: store} }

const (
	defaultTokenPage = 50
	maxTokenPage     = 100
)

// ListTokens implements TokenService.
func (s *TokenServer) ListTokens(ctx context.Context, req *taskrunnerv1.ListTokensRequest) (*taskrunnerv1.ListTokensResponse, error) {
	p, err := Require(ctx)
	if err != nil {
		return nil, err
	}
	limit := int(req.GetPageSize())
	switch {
	case limit < 0 || limit > maxTokenPage:
		return nil, errs.Invalid("page_size", "want 1 to %d, got %d", maxTokenPage, limit)
	case limit == 0:
		limit = defaultTokenPage
	}
	o := ListOptions{Limit: limit, IncludeInactive: req.GetIncludeInactive()}
	if req.GetPageToken() != "" {
		if o.After, err = decodeTokenCursor(req.GetPageToken()); err != nil {
			return nil, err
		}
	}
	toks, more, err := s.store.List(ctx, p.Owner, o)
	if err != nil {
		return nil, err
	}
	resp := &taskrunnerv1.ListTokensResponse{}
	for _, t := range toks {
		resp.Tokens = append(resp.Tokens, TokenProto(t))
	}
	if more {
		last := toks[len(toks)-1]
		resp.NextPageToken = encodeTokenCursor(Cursor{CreatedAt: last.CreatedAt, ID: last.ID})
	}
	return resp, nil
}

// RevokeToken implements TokenService.
func (s *TokenServer) RevokeToken(ctx context.Context, req *taskrunnerv1.RevokeTokenRequest) (*taskrunnerv1.RevokeTokenResponse, error) {
	p, err := Require(ctx)
	if err != nil {
		return nil, err
	}
	if req.GetId() == "" {
		return nil, errs.Invalid("id", "must not be empty")
	}
	t, err := s.store.RevokeOwned(ctx, p.Owner, req.GetId())
	if err != nil {
		return nil, err
	}
	return &taskrunnerv1.RevokeTokenResponse{Token: TokenProto(t)}, nil
}

// TokenProto converts a stored token to its wire form.
func TokenProto(t Token) *taskrunnerv1.Token {
	ts := func(v *time.Time) *timestamppb.Timestamp {
		if v == nil {
			return nil
		}
		return timestamppb.New(*v)
	}
	return &taskrunnerv1.Token{
		Id: t.ID, Name: t.Name, Owner: t.Owner, Scopes: t.Scopes, Description: t.Description,
		CreateTime: timestamppb.New(t.CreatedAt), LastUseTime: ts(t.LastUsedAt), ExpireTime: ts(t.ExpiresAt), RevokeTime: ts(t.RevokedAt),
	}
}

func encodeTokenCursor(c Cursor) string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeTokenCursor(tok string) (*Cursor, error) {
	bad := errs.Invalid("page_token", "is not a token returned by ListTokens")
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return nil, bad
	}
	var c Cursor
	if err := json.Unmarshal(b, &c); err != nil || c.CreatedAt.IsZero() {
		return nil, bad
	}
	if _, err := uuid.Parse(c.ID); err != nil {
		return nil, bad
	}
	return &c, nil
}
