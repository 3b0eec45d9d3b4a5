//! Compiles rls/proto/rls.proto (the RLS v3 messages) and
//! rls/proto/xds/ads.proto (the xDS client's) into prost messages and
//! tonic's servers and clients. protox parses the files in Rust, so no
//! `protoc` is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["rls.proto", "xds/ads.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
