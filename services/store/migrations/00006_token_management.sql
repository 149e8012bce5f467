-- +goose Up
-- Token management (taskctl token list|revoke, TokenService): a name to
-- tell tokens apart, an optional expiry, and an index for listing an
-- owner's tokens newest first. Existing tokens keep an empty name and never
-- expire.
ALTER TABLE api_tokens ADD COLUMN name text NOT NULL DEFAULT '' CHECK (length(name) <= 100);
ALTER TABLE api_tokens ADD COLUMN expires_at timestamptz;
CREATE INDEX api_tokens_owner_created ON api_tokens (owner, created_at DESC, id DESC);

-- +goose Down
DROP INDEX api_tokens_owner_created;
ALTER TABLE api_tokens DROP COLUMN expires_at;
ALTER TABLE api_tokens DROP COLUMN name;
