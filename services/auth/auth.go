package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/taskrunner/taskrunner/services/errs"
)

// Scopes a token can carry.
const (
	// ScopeTasks lets a caller create and manage its own tasks.
	ScopeTasks = "tasks"
	// ScopeInternal lets a service call internal RPCs (AdvanceTask, Dispatch…)
	// for any owner's task.
	ScopeInternal = "internal"
)

// TokenPrefix marks taskrunner API tokens so secret scanners and our own
// redaction can recognise them.
const TokenPrefix = "trt_"

// Principal is an authenticated caller.
type Principal struct {
	TokenID string
	Owner   string
	Scopes  []string
}

// Has reports whether the principal carries scope.
func (p Principal) Has(scope string) bool { return slices.Contains(p.Scopes, scope) }

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the caller, if authenticated.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// Require returns the caller or Unauthenticated.
func Require(ctx context.Context) (Principal, error) {
	p, ok := FromContext(ctx)
	if !ok || p.Owner == "" {
		return Principal{}, errs.Unauthenticated("missing or invalid bearer token")
	}
	return p, nil
}

// RequireScope returns the caller when it carries scope.
func RequireScope(ctx context.Context, scope string) (Principal, error) {
	p, err := Require(ctx)
	if err != nil {
		return p, err
	}
	if !p.Has(scope) {
		return p, errs.PermissionDenied("token lacks scope " + scope)
	}
	return p, nil
}

// NewToken returns a fresh random token and its hash.
func NewToken() (plain string, hash []byte) {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	plain = TokenPrefix + base64.RawURLEncoding.EncodeToString(b)
	return plain, Hash(plain)
}

// Hash is how tokens are stored.
func Hash(plain string) []byte {
	h := sha256.Sum256([]byte(plain))
	return h[:]
}

// Store keeps tokens in api_tokens.
type Store struct {
	pool *pgxpool.Pool
	now  func() time.Time
}

// NewStore returns a token store on pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool, now: time.Now} }

const insertToken = `INSERT INTO api_tokens (id, owner, token_hash, scopes, description) VALUES ($1, $2, $3, $4, $5)`

// Create makes a token for owner and returns its text (shown once) and id.
func (s *Store) Create(ctx context.Context, owner string, scopes []string, description string) (plain, id string, err error) {
	owner = strings.TrimSpace(owner)
	if owner == "" {
		return "", "", errs.Invalid("owner", "must not be empty")
	}
	if len(scopes) == 0 {
		scopes = []string{ScopeTasks}
	}
	for _, sc := range scopes {
		if sc != ScopeTasks && sc != ScopeInternal {
			return "", "", errs.Invalid("scopes", "unknown scope %q", sc)
		}
	}
	plain, hash := NewToken()
	tid := uuid.NewString()
	if _, err := s.pool.Exec(ctx, insertToken, tid, owner, hash, scopes, description); err != nil {
		return "", "", err
	}
	return plain, tid, nil
}

const lookupToken = `UPDATE api_tokens SET last_used_at = now()
WHERE token_hash = $1 AND revoked_at IS NULL
RETURNING id, owner, scopes`

// Authenticate resolves a bearer token to its principal.
func (s *Store) Authenticate(ctx context.Context, token string) (Principal, error) {
	if !strings.HasPrefix(token, TokenPrefix) {
		return Principal{}, errs.Unauthenticated("invalid bearer token")
	}
	var p Principal
	err := s.pool.QueryRow(ctx, lookupToken, Hash(token)).Scan(&p.TokenID, &p.Owner, &p.Scopes)
	if errors.Is(err, pgx.ErrNoRows) {
		return Principal{}, errs.Unauthenticated("invalid bearer token")
	}
	if err != nil {
		return Principal{}, err
	}
	return p, nil
}

// Revoke disables a token by id.
func (s *Store) Revoke(ctx context.Context, id string) error {
	tag, err := s.pool.Exec(ctx, `UPDATE api_tokens SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL`, id)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return errs.NotFound("token", id)
	}
	return nil
}

// BearerFromHeader extracts the token from an "Authorization: Bearer X" value.
func BearerFromHeader(v string) (string, bool) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(v), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}
