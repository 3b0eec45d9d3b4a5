//! Command handlers: parse, load state, decide, store, propagate, reply.
//! No arithmetic lives here; the decisions come from `crate::limiter`. Every
//! handler is safe Rust, `fn(&Context, &Argv) -> Result<(), Error>`; the
//! server reaches it through `crate::ffi`.

pub mod all;
pub mod limiter;
pub mod log;
pub mod policy;
pub mod setstate;

use crate::ffi::{Arg, Context};
use crate::limiter::Decision;

/// Most arguments a single-limiter command accepts; more is an error before
/// any parsing, so argument slices live on the stack.
pub const MAX_ARGS: usize = 16;

/// `COST n [FORCE]`: the units a call takes, and whether it takes them even
/// when the limiter would deny (a penalty, leaving the limiter in debt).
pub const COST: Arg = Arg::block(
    c"cost",
    &[
        Arg::integer(c"units").summary(c"units this call takes (default 1; 0 inspects)"),
        Arg::keyword(c"force", c"FORCE")
            .optional()
            .summary(c"take the units even if the limiter would deny them"),
    ],
)
.token(c"COST");

/// `[COST n [FORCE] | REFUND n]`, the options of every limiter command and
/// of `RL.HIT`.
pub const COST_OR_REFUND: Arg = Arg::one_of(
    c"cost-or-refund",
    &[
        COST,
        Arg::block(
            c"refund",
            &[Arg::integer(c"units").summary(c"units to give back, at most those consumed")],
        )
        .token(c"REFUND"),
    ],
)
.optional();

/// Whether a new key must not be created: used memory is above `maxmemory`
/// and the server may not evict (`noeviction`). With an eviction policy,
/// Redis has just evicted before running the command, as it does for its own
/// `deny-oom` commands, and what is left above the limit is transient.
pub fn out_of_memory(ctx: &Context) -> bool {
    ctx.flags().out_of_memory() && !may_evict(ctx)
}

/// `maxmemory-policy` is not `noeviction` (asked only when over the limit).
fn may_evict(ctx: &Context) -> bool {
    ctx.config_get(c"maxmemory-policy", |policy| policy != b"noeviction")
        .unwrap_or(false)
}

/// The five-integer reply of every limiter command.
pub fn reply_decision(ctx: &Context, decision: &Decision) {
    ctx.reply_integers(&decision_fields(decision));
}

/// The five integers, and a sixth (`RL.ALL`'s `denied_by`).
pub fn reply_decision_and(ctx: &Context, decision: &Decision, sixth: i64) {
    let [a, b, c, d, e] = decision_fields(decision);
    ctx.reply_integers(&[a, b, c, d, e, sixth]);
}

fn decision_fields(decision: &Decision) -> [i64; 5] {
    [
        decision.allowed as i64,
        decision.limit as i64,
        decision.remaining as i64,
        decision.wait.as_reply(),
        decision.reset_ms as i64,
    ]
}

/// A HELP reply: one line per entry.
pub fn reply_lines(ctx: &Context, lines: &[&str]) {
    ctx.reply_array(lines.len());
    for line in lines {
        ctx.reply_bulk(line.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::words;

    #[test]
    fn a_call_needs_the_required_words_only() {
        let args = [
            Arg::key(c"key"),
            Arg::integer(c"limit"),
            Arg::integer(c"window_ms"),
            COST_OR_REFUND,
        ];
        assert_eq!(words(&args), (3, Some(6)), "up to COST n FORCE");
    }

    #[test]
    fn a_present_option_counts_its_token_and_its_members() {
        assert_eq!(COST.words(), (2, Some(3)), "COST n [FORCE]");
        assert_eq!(
            COST_OR_REFUND.words(),
            (2, Some(3)),
            "REFUND n or COST n [FORCE]"
        );
        assert_eq!(Arg::keyword(c"force", c"FORCE").words(), (1, Some(1)));
    }
}
