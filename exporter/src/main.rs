//! The `redis-ratelimit-exporter` binary: see `--help` and exporter/README.md.

use redis_ratelimit_exporter::config::{self, Command};

fn main() {
    let command = match config::parse(std::env::args().skip(1), |k| std::env::var(k).ok()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("redis-ratelimit-exporter: {e}");
            std::process::exit(2);
        }
    };
    let config = match command {
        Command::Help => {
            print!("{}", config::USAGE);
            return;
        }
        Command::Version => {
            println!("redis-ratelimit-exporter {}", env!("CARGO_PKG_VERSION"));
            return;
        }
        Command::Run(c) => c,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("redis-ratelimit-exporter: starting the runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(redis_ratelimit_exporter::run(config)) {
        eprintln!("redis-ratelimit-exporter: {e}");
        std::process::exit(1);
    }
}
