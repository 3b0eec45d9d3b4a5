//! The one panic guard every `extern "C"` entry point goes through.
//!
//! A Rust panic unwinding into redis-server's C frames would abort the whole
//! server. Every command handler and callback therefore runs inside
//! [`catch_unwind`]: a command answers an error reply instead (having changed
//! nothing, since every handler writes only after it has decided), and a
//! callback returns its failure value.

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::context::Context;
use crate::error::Error;

/// Runs a command body; its error (or a caught panic) becomes the error reply.
pub fn command(ctx: &Context, body: impl FnOnce() -> Result<(), Error>) {
    let outcome = catch_unwind(AssertUnwindSafe(body)).unwrap_or(Err(Error::Internal));
    if let Err(error) = outcome {
        // Replying may itself fail only on a broken server; never unwind from here.
        let _ = catch_unwind(AssertUnwindSafe(|| ctx.reply_error(&error)));
    }
}

/// Runs a callback; a caught panic yields `failed`.
pub fn callback<T>(failed: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(failed)
}
