//! Every command's argument parser, then its algorithm (see docs/fuzzing.md).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| redis_ratelimit::fuzzing::command(data));
