package githubtoken

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// tokenCache keeps installation tokens in Redis, sealed with AES-256-GCM. Keys name the
// installation and repository only; the Redis key is the GCM additional data, so a value
// copied under another key does not open. Redis holds derived state only: every failure
// here is a cache miss, never an error for the caller.
type tokenCache struct {
	rdb    redis.UniversalClient
	prefix string
	aead   cipher.AEAD
}

type cachedToken struct {
	Token     string    `json:"t"`
	ExpiresAt time.Time `json:"e"`
}

// deriveCacheKey turns the App's private key into the cache encryption key, so replicas that
// share the App key share the cache and a Redis reader without it learns nothing.
func deriveCacheKey(appKeyPEM []byte) ([]byte, error) {
	return hkdf.Key(sha256.New, appKeyPEM, []byte("taskrunner githubtoken cache v1"), "token cache", 32)
}

func newTokenCache(rdb redis.UniversalClient, prefix string, key []byte) (*tokenCache, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, errors.New("githubtoken: bad cache key")
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, errors.New("githubtoken: bad cache key")
	}
	return &tokenCache{rdb: rdb, prefix: prefix, aead: aead}, nil
}

func repoKey(repo string) string { return strings.ToLower(repo) }

func (c *tokenCache) installationKey(repo string) string {
	return c.prefix + "installation:" + repoKey(repo)
}

func (c *tokenCache) tokenKey(installation int64, repo string) string {
	return c.prefix + "token:" + strconv.FormatInt(installation, 10) + ":" + repoKey(repo)
}

// installation returns the cached installation id of repo (0 when unknown).
func (c *tokenCache) installation(ctx context.Context, repo string) (int64, error) {
	v, err := c.rdb.Get(ctx, c.installationKey(repo)).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return v, err
}

func (c *tokenCache) setInstallation(ctx context.Context, repo string, id int64) error {
	return c.rdb.Set(ctx, c.installationKey(repo), id, installationTTL).Err()
}

func (c *tokenCache) forgetInstallation(ctx context.Context, repo string) error {
	return c.rdb.Del(ctx, c.installationKey(repo)).Err()
}

// token returns the cached token of (installation, repo), if any and still good at now plus
// refreshBefore. ok is false on a miss; err reports Redis or decryption trouble (also a miss).
func (c *tokenCache) token(ctx context.Context, installation int64, repo string, now time.Time, refreshBefore time.Duration) (cachedToken, bool, error) {
	key := c.tokenKey(installation, repo)
	sealed, err := c.rdb.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return cachedToken{}, false, nil
	}
	if err != nil {
		return cachedToken{}, false, err
	}
	ns := c.aead.NonceSize()
	if len(sealed) < ns {
		return cachedToken{}, false, errors.New("cached value is too short")
	}
	plain, err := c.aead.Open(nil, sealed[:ns], sealed[ns:], []byte(key))
	if err != nil {
		return cachedToken{}, false, errors.New("cached value does not decrypt (key changed?)")
	}
	var ct cachedToken
	if err := json.Unmarshal(plain, &ct); err != nil || ct.Token == "" {
		return cachedToken{}, false, errors.New("cached value is malformed")
	}
	if ct.ExpiresAt.Sub(now) <= refreshBefore {
		return cachedToken{}, false, nil
	}
	return ct, true, nil
}

// setToken stores ct until refreshBefore ahead of its expiry (nothing when that has passed).
func (c *tokenCache) setToken(ctx context.Context, installation int64, repo string, ct cachedToken, now time.Time, refreshBefore time.Duration) error {
	ttl := ct.ExpiresAt.Sub(now) - refreshBefore
	if ttl <= 0 {
		return nil
	}
	ttl = min(ttl, maxTokenLife)
	key := c.tokenKey(installation, repo)
	plain, err := json.Marshal(ct)
	if err != nil {
		return err
	}
	nonce := make([]byte, c.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return fmt.Errorf("nonce: %w", err)
	}
	sealed := c.aead.Seal(nonce, nonce, plain, []byte(key))
	return c.rdb.Set(ctx, key, sealed, ttl).Err()
}
