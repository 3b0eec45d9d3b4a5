//! What only one algorithm promises: its formulas seen from a client. What
//! they all promise is in `contract`.

mod concurrency;
mod fixed_window;
mod hash_window;
mod leaky_bucket;
mod quota;
mod sliding_log;
mod token_bucket;
