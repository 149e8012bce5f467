# Runner image: the in-sandbox binary, git, bash, Node.js 22 and the pinned agent CLIs
# (Claude Code, Codex, OpenSpec from the repository's package.json / package-lock.json).
#
# Build from the repository root:
#   docker build -f deploy/docker/runner.Dockerfile -t ghcr.io/taskrunner/runner:0.1.0 .
#
# User: uid 1000 (the `node` user of the Node.js image). The runner drops privileges only when
# it starts as root (runner/cmd/runner: os.Geteuid() == 0 → TASKRUNNER_AGENT_USER); started as
# 1000 it runs git, openspec and the agent as itself, which works because:
#   - the workspace (TASKRUNNER_WORKDIR below) is owned by 1000, and stages.PrepareDirs only
#     chowns when it has a user to switch to;
#   - Claude Code accepts --permission-mode bypassPermissions for a non-root user, so no
#     IS_SANDBOX override is needed (stages.AgentEnv sets it only for root without a user).
# The isolation boundary is the sandbox (container, microVM, Fly Machine), not a second uid.
# See deploy/README.md, "Runner image and uid 1000", for the trade-off.

FROM golang:1.26.8-trixie AS build
WORKDIR /src
COPY go.work go.work.sum ./
COPY proto/ proto/
COPY services/ services/
COPY gateway/ gateway/
COPY runner/ runner/
COPY tools/ tools/
RUN --mount=type=cache,target=/root/.cache/go-build \
    --mount=type=cache,target=/go/pkg/mod \
    CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath -ldflags="-s -w" -o /out/runner ./runner/cmd/runner

# The agent CLIs, exactly as locked (npm ci fails when package-lock.json disagrees).
# Same base as the final stage, so Claude Code's postinstall picks the right native binary.
FROM node:22.21.1-trixie-slim AS agents
WORKDIR /opt/taskrunner/agents
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force

FROM node:22.21.1-trixie-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends git bash ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /workspace && chown 1000:1000 /workspace
COPY --from=agents /opt/taskrunner/agents /opt/taskrunner/agents
COPY --from=build /out/runner /usr/local/bin/runner
ENV PATH=/opt/taskrunner/agents/node_modules/.bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    TASKRUNNER_WORKDIR=/workspace \
    TASKRUNNER_AGENT_USER=1000
USER 1000:1000
WORKDIR /workspace
ENTRYPOINT ["/usr/local/bin/runner"]
