package forge

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// installationPermissions is what every installation of the forge's app was granted; a token
// can be restricted to less, never more.
var installationPermissions = map[string]string{
	"contents":      "write",
	"pull_requests": "write",
	"metadata":      "read",
	"issues":        "write",
	"workflows":     "write",
	"statuses":      "write",
	"checks":        "write",
}

func permLevel(s string) int {
	switch s {
	case "read":
		return 1
	case "write":
		return 2
	case "admin":
		return 3
	}
	return 0
}

type token struct {
	id             string
	installationID int64
	repoIDs        map[int64]bool // nil: every repository of the installation
	permissions    map[string]string
	expiresAt      time.Time
}

// personalLogin is the user behind the personal token; it is admin of every repository.
const personalLogin = "forge-user"

// botLogin is the user behind installation tokens.
const botLogin = "forge[bot]"

// principal is who made a request: an installation token, the personal token, or a user the
// test-facing /_forge/as/{user}/ prefix acts as.
type principal struct {
	id   string
	tok  *token // nil for the personal token and for users
	user string // the acting user's login; empty otherwise
}

// login is the user GitHub would show as the author of what p does.
func (p *principal) login() string {
	switch {
	case p.user != "":
		return p.user
	case p.tok == nil:
		return personalLogin
	}
	return botLogin
}

// allows reports whether p may use permission perm at level on rp: false when rp is outside
// the token's installation or repositories, or the token lacks the permission. Acting users
// are checked by Forge.userAllows instead (their role lives under f.mu).
func (p *principal) allows(rp *repo, perm, level string) bool {
	if p.user != "" {
		return false
	}
	if p.tok == nil {
		return true
	}
	if p.tok.installationID != rp.owner.installationID {
		return false
	}
	if p.tok.repoIDs != nil && !p.tok.repoIDs[rp.id] {
		return false
	}
	return permLevel(p.tok.permissions[perm]) >= permLevel(level)
}

func hashToken(text string) string {
	sum := sha256.Sum256([]byte(text))
	return hex.EncodeToString(sum[:])
}

const tokenAlphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

func randomToken() (string, error) {
	var b strings.Builder
	b.WriteString("ghs_")
	max := big.NewInt(int64(len(tokenAlphabet)))
	for range 36 {
		n, err := rand.Int(rand.Reader, max)
		if err != nil {
			return "", err
		}
		b.WriteByte(tokenAlphabet[n.Int64()])
	}
	return b.String(), nil
}

// credential extracts a token from "token X", "Bearer X" or Basic auth (password).
func credential(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return "", false
	}
	scheme, rest, _ := strings.Cut(h, " ")
	rest = strings.TrimSpace(rest)
	switch strings.ToLower(scheme) {
	case "token", "bearer":
		return rest, rest != ""
	case "basic":
		raw, err := base64.StdEncoding.DecodeString(rest)
		if err != nil {
			return "", false
		}
		_, pass, ok := strings.Cut(string(raw), ":")
		return pass, ok && pass != ""
	}
	return "", false
}

var (
	errNoCredentials  = errors.New("Requires authentication")
	errBadCredentials = errors.New("Bad credentials")
)

// authenticate resolves a personal or installation token; expired and unknown tokens are
// errBadCredentials.
func (f *Forge) authenticate(r *http.Request) (*principal, error) {
	if login, ok := r.Context().Value(actingKey{}).(string); ok {
		id := "user:" + login
		f.annotate(r, func(rec *Request) { rec.TokenID = id })
		return &principal{id: id, user: login}, nil
	}
	text, ok := credential(r)
	if !ok {
		return nil, errNoCredentials
	}
	if f.cfg.PersonalToken != "" && subtle.ConstantTimeCompare([]byte(text), []byte(f.cfg.PersonalToken)) == 1 {
		f.annotate(r, func(rec *Request) { rec.TokenID = "personal" })
		return &principal{id: "personal"}, nil
	}
	f.mu.Lock()
	tok := f.tokens[hashToken(text)]
	f.mu.Unlock()
	if tok == nil {
		return nil, errBadCredentials
	}
	f.annotate(r, func(rec *Request) { rec.TokenID = tok.id })
	if !f.now().Before(tok.expiresAt) {
		f.log.Info("forge: expired token refused", "token_id", tok.id)
		return nil, errBadCredentials
	}
	return &principal{id: tok.id, tok: tok}, nil
}

// verifyAppJWT checks an app JWT the way GitHub does: RS256 with the app key, iat not in the
// future, exp in the future and at most 10 minutes after iat, iss = app id or client id.
func (f *Forge) verifyAppJWT(r *http.Request) (jwt.MapClaims, error) {
	h := r.Header.Get("Authorization")
	scheme, raw, _ := strings.Cut(h, " ")
	if !strings.EqualFold(scheme, "bearer") || strings.Count(raw, ".") != 2 {
		return nil, errors.New("A JSON web token could not be decoded")
	}
	claims := jwt.MapClaims{}
	_, err := jwt.ParseWithClaims(strings.TrimSpace(raw), claims, func(*jwt.Token) (any, error) {
		return f.cfg.AppPublicKey, nil
	}, jwt.WithValidMethods([]string{"RS256"}), jwt.WithTimeFunc(f.now), jwt.WithIssuedAt(), jwt.WithExpirationRequired())
	if err != nil {
		return nil, fmt.Errorf("'Authorization' JWT is invalid: %w", err)
	}
	iat, err := claims.GetIssuedAt()
	if err != nil || iat == nil {
		return nil, errors.New("'Issued at' claim ('iat') is required")
	}
	exp, _ := claims.GetExpirationTime()
	if exp.Sub(iat.Time) > 10*time.Minute {
		return nil, errors.New("'Expiration time' claim ('exp') is too far in the future")
	}
	if !f.issuerOK(claims["iss"]) {
		return nil, errors.New("'Issuer' claim ('iss') must be an Integer or the app's client id")
	}
	return claims, nil
}

func (f *Forge) issuerOK(iss any) bool {
	switch v := iss.(type) {
	case string:
		return v == strconv.FormatInt(f.cfg.AppID, 10) || v == f.cfg.ClientID
	case float64:
		return v == float64(f.cfg.AppID)
	case json.Number:
		n, err := v.Int64()
		return err == nil && n == f.cfg.AppID
	}
	return false
}

// tokenRequest is the body of POST /app/installations/{id}/access_tokens.
type tokenRequest struct {
	Repositories  []string          `json:"repositories"`
	RepositoryIDs []int64           `json:"repository_ids"`
	Permissions   map[string]string `json:"permissions"`
}

// errUnprocessable carries a 422 message.
type errUnprocessable struct{ msg string }

func (e errUnprocessable) Error() string { return e.msg }

// mintToken creates an installation token restricted to req; the text is returned once and
// only its hash is kept.
func (f *Forge) mintToken(o *owner, req tokenRequest) (string, *token, []*repo, error) {
	perms := map[string]string{}
	if len(req.Permissions) == 0 {
		for k, v := range installationPermissions {
			perms[k] = v
		}
	} else {
		for k, v := range req.Permissions {
			granted, known := installationPermissions[k]
			if !known || permLevel(v) == 0 || permLevel(v) > permLevel(granted) {
				return "", nil, nil, errUnprocessable{fmt.Sprintf("The permissions requested are not granted to this installation: %s=%s", k, v)}
			}
			perms[k] = v
		}
		if _, ok := perms["metadata"]; !ok {
			perms["metadata"] = "read"
		}
	}
	text, err := randomToken()
	if err != nil {
		return "", nil, nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var selected []*repo
	var ids map[int64]bool
	if len(req.Repositories) > 0 || len(req.RepositoryIDs) > 0 {
		ids = map[int64]bool{}
		add := func(rp *repo) {
			if !ids[rp.id] {
				ids[rp.id] = true
				selected = append(selected, rp)
			}
		}
		for _, name := range req.Repositories {
			rp := f.repos[strings.ToLower(o.login+"/"+name)]
			if rp == nil {
				return "", nil, nil, errUnprocessable{"There is at least one repository that does not exist or is not accessible to the parent installation."}
			}
			add(rp)
		}
		for _, id := range req.RepositoryIDs {
			var found *repo
			for _, rp := range f.repos {
				if rp.id == id && rp.owner == o {
					found = rp
				}
			}
			if found == nil {
				return "", nil, nil, errUnprocessable{"There is at least one repository that does not exist or is not accessible to the parent installation."}
			}
			add(found)
		}
	}
	f.nextToken++
	tok := &token{
		id:             fmt.Sprintf("ghs-%d", f.nextToken),
		installationID: o.installationID,
		repoIDs:        ids,
		permissions:    perms,
		expiresAt:      f.now().Add(f.cfg.TokenTTL).UTC().Truncate(time.Second),
	}
	f.tokens[hashToken(text)] = tok
	return text, tok, selected, nil
}

// MintInstallationToken is a test shortcut around POST /app/installations/{id}/access_tokens:
// it mints a token for ownerLogin's installation restricted to repos (none: all) and perms
// (nil: all). It returns the token text, its id (as recorded in Requests) and its expiry.
func (f *Forge) MintInstallationToken(ownerLogin string, repos []string, perms map[string]string) (text, id string, expiresAt time.Time, err error) {
	f.mu.Lock()
	o := f.owners[strings.ToLower(ownerLogin)]
	f.mu.Unlock()
	if o == nil {
		return "", "", time.Time{}, fmt.Errorf("forge: owner %q has no installation", ownerLogin)
	}
	text, tok, _, err := f.mintToken(o, tokenRequest{Repositories: repos, Permissions: perms})
	if err != nil {
		return "", "", time.Time{}, err
	}
	return text, tok.id, tok.expiresAt, nil
}

// LoadOrCreateAppKey reads a PEM RSA private key (PKCS#1 or PKCS#8) from path, or generates an
// RSA 2048 key and writes it there (mode 0600) when the file does not exist.
func LoadOrCreateAppKey(path string) (key *rsa.PrivateKey, created bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			return nil, false, err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, false, err
		}
		block := &pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			return nil, false, err
		}
		return key, true, nil
	}
	if err != nil {
		return nil, false, err
	}
	key, err = jwt.ParseRSAPrivateKeyFromPEM(data)
	if err != nil {
		return nil, false, fmt.Errorf("forge: app key %s: %w", path, err)
	}
	return key, false, nil
}

// SignAppJWT signs an app JWT as GitHub documents it: RS256, iat = now-60s, exp = now+9m,
// iss = issuer (the app id or client id).
func SignAppJWT(key *rsa.PrivateKey, issuer string, now time.Time) (string, error) {
	claims := jwt.RegisteredClaims{
		Issuer:    issuer,
		IssuedAt:  jwt.NewNumericDate(now.Add(-60 * time.Second)),
		ExpiresAt: jwt.NewNumericDate(now.Add(9 * time.Minute)),
	}
	return jwt.NewWithClaims(jwt.SigningMethodRS256, claims).SignedString(key)
}
