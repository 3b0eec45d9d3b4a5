//! Compiles rls/proto/rls.proto into the RLS v3 messages and tonic's server
//! and client. protox parses the file in Rust, so no `protoc` is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/rls.proto");
    let fds = protox::compile(["rls.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
