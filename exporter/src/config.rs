//! Flags and environment variables. A flag wins over its variable; every bad
//! value is refused with an error naming the flag or variable.

use std::net::SocketAddr;
use std::time::Duration;

/// What the exporter runs with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The nodes, as URLs (`redis://[user:password@]host:port`, `unix:///path`).
    pub redis_urls: Vec<String>,
    /// Where /metrics is served.
    pub listen: SocketAddr,
    /// How long connecting to a node may take.
    pub connect_timeout: Duration,
    /// How long the whole scrape of one node may take (connecting included).
    pub scrape_timeout: Duration,
    /// Whether to read `RL.POLICY LIST`/`GET` for `redis_ratelimit_policy_info`.
    pub policy_info: bool,
}

pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379";
pub const DEFAULT_LISTEN: &str = "0.0.0.0:9122";
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

pub const USAGE: &str = "\
redis-ratelimit-exporter: INFO ratelimit of Redis/Valkey nodes running the
redis-ratelimit module, as Prometheus series on GET /metrics.

Usage: redis-ratelimit-exporter [options]

  --redis-url URL        a node to scrape; repeat for several nodes
                         (env RL_EXPORTER_REDIS_URLS, comma-separated;
                         default redis://127.0.0.1:6379). URL forms:
                         redis://[user:password@]host:port, unix:///path/redis.sock
  --listen ADDR          address to serve /metrics on
                         (env RL_EXPORTER_LISTEN; default 0.0.0.0:9122)
  --connect-timeout D    connecting to a node (env RL_EXPORTER_CONNECT_TIMEOUT;
                         default 2s). D: 500ms, 2s, 1.5 (seconds)
  --scrape-timeout D     the whole scrape of one node (env RL_EXPORTER_SCRAPE_TIMEOUT;
                         default 5s)
  --no-policy-info       do not read RL.POLICY LIST/GET (no redis_ratelimit_policy_info)
                         (env RL_EXPORTER_POLICY_INFO=false)
  -h, --help             this text
  -V, --version          the version
";

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Run(Config),
    Help,
    Version,
}

/// Reads `args` (without the program name) and the variables `env` gives.
pub fn parse(
    args: impl IntoIterator<Item = String>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Command, String> {
    let mut urls: Vec<String> = Vec::new();
    let mut listen: Option<String> = None;
    let mut connect: Option<String> = None;
    let mut scrape: Option<String> = None;
    let mut policy_info: Option<bool> = None;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            match inline.clone().or_else(|| args.next()) {
                Some(v) => Ok(v),
                None => Err(format!("{name} needs a value")),
            }
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "-V" | "--version" => return Ok(Command::Version),
            "--redis-url" => urls.push(value("--redis-url")?),
            "--listen" => listen = Some(value("--listen")?),
            "--connect-timeout" => connect = Some(value("--connect-timeout")?),
            "--scrape-timeout" => scrape = Some(value("--scrape-timeout")?),
            "--no-policy-info" if inline.is_none() => policy_info = Some(false),
            _ => return Err(format!("unknown argument {arg:?} (see --help)")),
        }
    }

    let redis_urls = if !urls.is_empty() {
        for u in &urls {
            check_url("--redis-url", u)?;
        }
        urls
    } else if let Some(list) = env("RL_EXPORTER_REDIS_URLS") {
        let list: Vec<String> = list
            .split(',')
            .map(|u| u.trim().to_string())
            .filter(|u| !u.is_empty())
            .collect();
        if list.is_empty() {
            return Err("RL_EXPORTER_REDIS_URLS is set but lists no URL".into());
        }
        for u in &list {
            check_url("RL_EXPORTER_REDIS_URLS", u)?;
        }
        list
    } else {
        vec![DEFAULT_URL.to_string()]
    };
    let mut labels: Vec<(String, &str)> = Vec::new();
    for u in &redis_urls {
        let label = node_label(u).map_err(|e| format!("redis URL {u:?}: {e}"))?;
        if let Some((_, first)) = labels.iter().find(|(l, _)| *l == label) {
            return Err(format!(
                "redis URLs {first:?} and {u:?} name the same node {label}: give each node once"
            ));
        }
        labels.push((label, u));
    }

    let (listen, listen_from) = pick(listen, "--listen", &env, "RL_EXPORTER_LISTEN");
    let listen = listen.as_deref().unwrap_or(DEFAULT_LISTEN);
    let listen: SocketAddr = listen.parse().map_err(|_| {
        format!("{listen_from} {listen:?}: not an address and port such as 0.0.0.0:9122")
    })?;

    let duration = |flag: Option<String>, name: &str, var: &str, default| {
        let (v, from) = pick(flag, name, &env, var);
        match v {
            None => Ok(default),
            Some(v) => parse_duration(&v).map_err(|e| format!("{from} {v:?}: {e}")),
        }
    };
    let connect_timeout = duration(
        connect,
        "--connect-timeout",
        "RL_EXPORTER_CONNECT_TIMEOUT",
        DEFAULT_CONNECT_TIMEOUT,
    )?;
    let scrape_timeout = duration(
        scrape,
        "--scrape-timeout",
        "RL_EXPORTER_SCRAPE_TIMEOUT",
        DEFAULT_SCRAPE_TIMEOUT,
    )?;

    let policy_info = match policy_info {
        Some(v) => v,
        None => match env("RL_EXPORTER_POLICY_INFO") {
            None => true,
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => true,
                "0" | "false" | "no" | "off" => false,
                _ => return Err(format!("RL_EXPORTER_POLICY_INFO {v:?}: not true or false")),
            },
        },
    };

    Ok(Command::Run(Config {
        redis_urls,
        listen,
        connect_timeout,
        scrape_timeout,
        policy_info,
    }))
}

/// The flag's value, else the variable's, with where it came from.
fn pick(
    flag: Option<String>,
    flag_name: &str,
    env: &impl Fn(&str) -> Option<String>,
    var: &str,
) -> (Option<String>, String) {
    match flag {
        Some(v) => (Some(v), flag_name.to_string()),
        None => (env(var), var.to_string()),
    }
}

fn check_url(from: &str, url: &str) -> Result<(), String> {
    node_label(url)
        .map(|_| ())
        .map_err(|e| format!("{from} {url:?}: {e}"))
}

/// The `node` label of a URL: `host:port` (or the socket's path), never the
/// password or the database.
pub fn node_label(url: &str) -> Result<String, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    Ok(client.get_connection_info().addr().to_string())
}

/// `500ms`, `2s`, `1.5s`, `1.5` (seconds): more than 0, at most a day.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (number, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        (t, 1.0)
    };
    let n: f64 = number
        .trim()
        .parse()
        .map_err(|_| "not a duration such as 500ms, 2s or 1.5".to_string())?;
    let secs = n * scale;
    if !secs.is_finite() || secs <= 0.0 || secs > 86_400.0 {
        return Err("must be more than 0 and at most a day".into());
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str], env: &[(&str, &str)]) -> Result<Config, String> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        match parse(args.iter().map(|s| s.to_string()), |k| {
            env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })? {
            Command::Run(c) => Ok(c),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn defaults() {
        let c = run(&[], &[]).unwrap();
        assert_eq!(c.redis_urls, vec![DEFAULT_URL]);
        assert_eq!(c.listen, "0.0.0.0:9122".parse().unwrap());
        assert_eq!(c.connect_timeout, Duration::from_secs(2));
        assert_eq!(c.scrape_timeout, Duration::from_secs(5));
        assert!(c.policy_info);
    }

    #[test]
    fn flags_win_over_env() {
        let env = [
            ("RL_EXPORTER_REDIS_URLS", "redis://a:1, redis://b:2,"),
            ("RL_EXPORTER_LISTEN", "127.0.0.1:1"),
            ("RL_EXPORTER_SCRAPE_TIMEOUT", "750ms"),
            ("RL_EXPORTER_POLICY_INFO", "false"),
        ];
        let c = run(&[], &env).unwrap();
        assert_eq!(c.redis_urls, vec!["redis://a:1", "redis://b:2"]);
        assert_eq!(c.listen, "127.0.0.1:1".parse().unwrap());
        assert_eq!(c.scrape_timeout, Duration::from_millis(750));
        assert!(!c.policy_info);
        let c = run(
            &[
                "--redis-url",
                "redis://c:3",
                "--redis-url=redis://:secret@d:4/2",
                "--listen",
                "[::1]:9",
                "--connect-timeout=1.5",
                "--scrape-timeout",
                "3s",
            ],
            &env,
        )
        .unwrap();
        assert_eq!(c.redis_urls, vec!["redis://c:3", "redis://:secret@d:4/2"]);
        assert_eq!(c.listen, "[::1]:9".parse().unwrap());
        assert_eq!(c.connect_timeout, Duration::from_millis(1500));
        assert_eq!(c.scrape_timeout, Duration::from_secs(3));
        let c = run(&["--no-policy-info"], &[]).unwrap();
        assert!(!c.policy_info);
    }

    #[test]
    fn labels_hide_passwords() {
        assert_eq!(
            node_label("redis://user:secret@10.0.0.1:6380/3").unwrap(),
            "10.0.0.1:6380"
        );
        assert_eq!(node_label("redis://h").unwrap(), "h:6379");
        assert_eq!(
            node_label("unix:///run/redis.sock").unwrap(),
            "/run/redis.sock"
        );
    }

    #[test]
    fn errors_name_the_argument() {
        let err = |args: &[&str], env: &[(&str, &str)]| run(args, env).unwrap_err();
        assert!(err(&["--redis-url"], &[]).contains("--redis-url needs a value"));
        assert!(err(&["--redis-url", "http://x"], &[]).starts_with("--redis-url"));
        assert!(
            err(&[], &[("RL_EXPORTER_REDIS_URLS", "nope")]).starts_with("RL_EXPORTER_REDIS_URLS")
        );
        assert!(
            err(&[], &[("RL_EXPORTER_REDIS_URLS", " , ")]).starts_with("RL_EXPORTER_REDIS_URLS")
        );
        assert!(err(
            &[
                "--redis-url",
                "redis://a:1/0",
                "--redis-url",
                "redis://a:1/1"
            ],
            &[]
        )
        .contains("same node a:1"));
        assert!(err(&["--listen", "9122"], &[]).starts_with("--listen"));
        assert!(err(&[], &[("RL_EXPORTER_LISTEN", "x")]).starts_with("RL_EXPORTER_LISTEN"));
        assert!(err(&["--connect-timeout", "0"], &[]).starts_with("--connect-timeout"));
        assert!(err(&["--scrape-timeout", "-1s"], &[]).starts_with("--scrape-timeout"));
        assert!(err(&["--scrape-timeout", "NaN"], &[]).starts_with("--scrape-timeout"));
        assert!(err(&[], &[("RL_EXPORTER_CONNECT_TIMEOUT", "soon")])
            .starts_with("RL_EXPORTER_CONNECT_TIMEOUT"));
        assert!(err(&[], &[("RL_EXPORTER_POLICY_INFO", "maybe")])
            .starts_with("RL_EXPORTER_POLICY_INFO"));
        assert!(err(&["--no-policy-info=1"], &[]).contains("unknown argument"));
        assert!(err(&["--verbose"], &[]).contains("unknown argument"));
    }

    #[test]
    fn help_and_version() {
        let p = |a: &str| parse([a.to_string()], |_| None).unwrap();
        assert_eq!(p("--help"), Command::Help);
        assert_eq!(p("-h"), Command::Help);
        assert_eq!(p("--version"), Command::Version);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration(" 2s ").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("0.25").unwrap(), Duration::from_millis(250));
        for bad in [
            "",
            "s",
            "ms",
            "0",
            "0ms",
            "-3",
            "inf",
            "1e9",
            "2 minutes",
            "1h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
