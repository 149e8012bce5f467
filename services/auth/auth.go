package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"slices"
	"strings"
	"sync"
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

// Store keeps tokens in api_tokens. Authenticate keeps a success for at
// most a second (see Authenticate); revocations through the Store clear it.
type Store struct {
	pool *pgxpool.Pool
	now  func() time.Time

	// A successful authentication is kept for authTTL, so a burst of
	// calls with one token (a connect storm: every SSE connect makes two
	// calls) reads the token once. A revocation through this Store clears
	// it at once; one made by another process is seen within authTTL.
	mu     sync.Mutex
	authed map[string]authEntry
}

// authTTL bounds how long a kept authentication is trusted (issue 15: no
// cache longer than a few seconds).
const authTTL = time.Second

// maxAuthed bounds the kept authentications (past it, the map starts over).
const maxAuthed = 10000

type authEntry struct {
	p       Principal
	expires *time.Time // the token's own expiry
	until   time.Time  // when the entry stops being trusted
}

// StoreOption configures a Store.
type StoreOption func(*Store)

// WithClock sets the clock that decides expiry (tests inject one).
func WithClock(now func() time.Time) StoreOption { return func(s *Store) { s.now = now } }

// NewStore returns a token store on pool.
func NewStore(pool *pgxpool.Pool, opts ...StoreOption) *Store {
	s := &Store{pool: pool, now: time.Now}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Token is a stored token's metadata; the token's text is never stored.
type Token struct {
	ID          string
	Name        string
	Owner       string
	Scopes      []string
	Description string
	CreatedAt   time.Time
	LastUsedAt  *time.Time
	ExpiresAt   *time.Time
	RevokedAt   *time.Time
}

// dbNow is the clock's time at PostgreSQL's precision, so that a time
// returned before and after a round trip through the table is the same.
func (s *Store) dbNow() time.Time { return s.now().UTC().Truncate(time.Microsecond) }

// Active reports whether the token still authenticates at now.
func (t Token) Active(now time.Time) bool {
	return t.RevokedAt == nil && (t.ExpiresAt == nil || now.Before(*t.ExpiresAt))
}

// TokenSpec describes a token to create.
type TokenSpec struct {
	Owner       string
	Name        string
	Scopes      []string // default: tasks
	Description string
	// TTL is the lifetime; zero means the token does not expire.
	TTL time.Duration
}

// MaxNameLen bounds token names (the column's CHECK agrees).
const MaxNameLen = 100

const insertToken = `INSERT INTO api_tokens (id, owner, token_hash, scopes, description, name, created_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`

// Issue creates a token and returns its text (shown once) and metadata.
func (s *Store) Issue(ctx context.Context, spec TokenSpec) (plain string, tok Token, err error) {
	owner := strings.TrimSpace(spec.Owner)
	if owner == "" {
		return "", Token{}, errs.Invalid("owner", "must not be empty")
	}
	name := strings.TrimSpace(spec.Name)
	if len(name) > MaxNameLen {
		return "", Token{}, errs.Invalid("name", "at most %d bytes", MaxNameLen)
	}
	scopes := spec.Scopes
	if len(scopes) == 0 {
		scopes = []string{ScopeTasks}
	}
	for _, sc := range scopes {
		if sc != ScopeTasks && sc != ScopeInternal {
			return "", Token{}, errs.Invalid("scopes", "unknown scope %q", sc)
		}
	}
	if spec.TTL < 0 {
		return "", Token{}, errs.Invalid("expires", "must not be negative")
	}
	now := s.dbNow()
	tok = Token{ID: uuid.NewString(), Name: name, Owner: owner, Scopes: scopes, Description: spec.Description, CreatedAt: now}
	if spec.TTL > 0 {
		exp := now.Add(spec.TTL)
		tok.ExpiresAt = &exp
	}
	plain, hash := NewToken()
	if _, err := s.pool.Exec(ctx, insertToken, tok.ID, owner, hash, scopes, spec.Description, name, now, tok.ExpiresAt); err != nil {
		return "", Token{}, err
	}
	return plain, tok, nil
}

// Create makes a token for owner that does not expire and returns its text
// (shown once) and id.
func (s *Store) Create(ctx context.Context, owner string, scopes []string, description string) (plain, id string, err error) {
	plain, tok, err := s.Issue(ctx, TokenSpec{Owner: owner, Scopes: scopes, Description: description})
	return plain, tok.ID, err
}

// lookupToken reads the token and, in the same statement, records its use.
// last_used_at is written at most once a minute per token so that a busy
// client does not turn every call into a row update.
const lookupToken = `WITH t AS (
	SELECT id, owner, scopes, revoked_at, expires_at, last_used_at FROM api_tokens WHERE token_hash = $1
), touch AS (
	UPDATE api_tokens a SET last_used_at = $2 FROM t
	WHERE a.id = t.id AND t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > $2)
	  AND (t.last_used_at IS NULL OR t.last_used_at < $2::timestamptz - interval '1 minute')
)
SELECT id, owner, scopes, revoked_at, expires_at FROM t`

// Authenticate resolves a bearer token to its principal. A success is kept
// for at most authTTL (one second): a token revoked through this Store is
// refused on the very next call, one revoked elsewhere within a second, an
// expired one as soon as it expires.
func (s *Store) Authenticate(ctx context.Context, token string) (Principal, error) {
	if !strings.HasPrefix(token, TokenPrefix) {
		return Principal{}, errs.Unauthenticated("invalid bearer token")
	}
	now := s.now()
	hash := Hash(token)
	s.mu.Lock()
	e, ok := s.authed[string(hash)]
	s.mu.Unlock()
	if ok && now.Before(e.until) && (e.expires == nil || now.Before(*e.expires)) {
		return e.p, nil
	}
	var p Principal
	var revoked, expires *time.Time
	err := s.pool.QueryRow(ctx, lookupToken, hash, now).Scan(&p.TokenID, &p.Owner, &p.Scopes, &revoked, &expires)
	if errors.Is(err, pgx.ErrNoRows) {
		return Principal{}, errs.Unauthenticated("invalid bearer token")
	}
	if err != nil {
		return Principal{}, err
	}
	if revoked != nil {
		return Principal{}, errs.Unauthenticated("bearer token revoked")
	}
	if expires != nil && !now.Before(*expires) {
		return Principal{}, errs.Unauthenticated("bearer token expired")
	}
	s.mu.Lock()
	if s.authed == nil || len(s.authed) >= maxAuthed {
		s.authed = map[string]authEntry{}
	}
	s.authed[string(hash)] = authEntry{p: p, expires: expires, until: now.Add(authTTL)}
	s.mu.Unlock()
	return p, nil
}

// forgetAuthenticated drops every kept authentication (after a revocation).
func (s *Store) forgetAuthenticated() {
	s.mu.Lock()
	s.authed = nil
	s.mu.Unlock()
}

// Revoke disables a token by id, whoever owns it (operators).
func (s *Store) Revoke(ctx context.Context, id string) error {
	if _, err := uuid.Parse(id); err != nil {
		return errs.NotFound("token", id)
	}
	tag, err := s.pool.Exec(ctx, `UPDATE api_tokens SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL`, id, s.now())
	s.forgetAuthenticated()
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return errs.NotFound("token", id)
	}
	return nil
}

const tokenColumns = `id, name, owner, scopes, description, created_at, last_used_at, expires_at, revoked_at`

func scanToken(row pgx.Row) (Token, error) {
	var t Token
	err := row.Scan(&t.ID, &t.Name, &t.Owner, &t.Scopes, &t.Description, &t.CreatedAt, &t.LastUsedAt, &t.ExpiresAt, &t.RevokedAt)
	return t, err
}

// revokeOwned sets revoked_at unless it is set already, and returns the row
// either way: revoking twice is not an error.
const revokeOwned = `WITH r AS (
	UPDATE api_tokens SET revoked_at = $3 WHERE id = $1 AND owner = $2 AND revoked_at IS NULL RETURNING id
)
SELECT ` + tokenColumns + ` FROM api_tokens WHERE id = $1 AND owner = $2`

// RevokeOwned revokes owner's token id and returns it. Another owner's
// token is NotFound, like an unknown one. Revoking a revoked token returns
// it unchanged.
func (s *Store) RevokeOwned(ctx context.Context, owner, id string) (Token, error) {
	if _, err := uuid.Parse(id); err != nil {
		return Token{}, errs.NotFound("token", id)
	}
	now := s.dbNow()
	t, err := scanToken(s.pool.QueryRow(ctx, revokeOwned, id, owner, now))
	s.forgetAuthenticated()
	if errors.Is(err, pgx.ErrNoRows) {
		return Token{}, errs.NotFound("token", id)
	}
	if err != nil {
		return Token{}, err
	}
	if t.RevokedAt == nil {
		// The CTE's update is not visible to the outer SELECT of the same
		// statement; the row was revoked just now.
		t.RevokedAt = &now
	}
	return t, nil
}

// Cursor is the position after the last token of a page.
type Cursor struct {
	CreatedAt time.Time
	ID        string
}

// ListOptions filter List.
type ListOptions struct {
	Limit           int
	After           *Cursor
	IncludeInactive bool
}

const listTokens = `SELECT ` + tokenColumns + ` FROM api_tokens
WHERE owner = $1
  AND ($2::boolean OR (revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $3)))
  AND ($4::timestamptz IS NULL OR (created_at, id) < ($4, $5::uuid))
ORDER BY created_at DESC, id DESC
LIMIT $6`

// List returns owner's tokens, newest first, and whether there are more.
func (s *Store) List(ctx context.Context, owner string, o ListOptions) ([]Token, bool, error) {
	var afterAt *time.Time
	var afterID *string
	if o.After != nil {
		afterAt, afterID = &o.After.CreatedAt, &o.After.ID
	}
	rows, err := s.pool.Query(ctx, listTokens, owner, o.IncludeInactive, s.now(), afterAt, afterID, o.Limit+1)
	if err != nil {
		return nil, false, err
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Token, error) { return scanToken(r) })
	if err != nil {
		return nil, false, err
	}
	if len(out) > o.Limit {
		return out[:o.Limit], true, nil
	}
	return out, false, nil
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
