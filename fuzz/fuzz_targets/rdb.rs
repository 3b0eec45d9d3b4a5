//! The RDB loaders of the native types and of the policies (see docs/fuzzing.md).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| redis_ratelimit::fuzzing::rdb(data));
