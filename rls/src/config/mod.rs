//! envoyproxy/ratelimit's YAML configuration (skeleton; see /tmp/prompts/rls-design.md).
