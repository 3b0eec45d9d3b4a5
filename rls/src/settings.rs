//! The environment: envoyproxy/ratelimit's variables and ours.
