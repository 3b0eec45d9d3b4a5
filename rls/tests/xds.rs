//! The xDS client (CONFIG_TYPE=GRPC_XDS_SOTW) against a real control plane
//! written here: a tonic ADS server over TCP (and TLS with certificates the
//! openssl CLI makes for each run) that serves RateLimitConfig snapshots and
//! records every DiscoveryRequest it receives, so the tests assert on what
//! `on_change` saw and on the ACKs and NACKs the server got.
//!
//! The last test runs the binary as Envoy Gateway runs envoyproxy/ratelimit
//! (xDS and gRPC both over TLS) and decides requests with the limits the
//! control plane sends; it skips itself while the binary ignores
//! CONFIG_TYPE.

#[allow(unused_imports)]
mod harness;

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message as _;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity, Server};
use tonic::{Request, Response, Status, Streaming};

use redis_ratelimit_rls::config::{Config, ConfigError, Unit};
use redis_ratelimit_rls::tls;
use redis_ratelimit_rls::xds::proto::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use redis_ratelimit_rls::xds::proto::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use redis_ratelimit_rls::xds::proto::{
    DiscoveryRequest, DiscoveryResponse, RateLimitConfig, RateLimitDescriptor, RateLimitPolicy,
    RateLimitUnit,
};
use redis_ratelimit_rls::xds::{self, XdsSettings, RATE_LIMIT_CONFIG_TYPE};

use harness::{wait_for, PATIENCE};

// ---------------------------------------------------------------------------
// The control plane.

/// What every stream of the control plane shares.
#[derive(Clone)]
struct Ads {
    /// Every request received, on every stream, in order.
    requests: Arc<Mutex<Vec<DiscoveryRequest>>>,
    /// The `x-token` header of every stream opened.
    tokens: Arc<Mutex<Vec<Option<String>>>>,
    /// The snapshot: sent to each stream when it opens and on every change.
    snapshot: watch::Receiver<Option<DiscoveryResponse>>,
    /// Bumped to fail every open stream (UNAVAILABLE), as a control plane
    /// restarting does.
    generation: watch::Receiver<u64>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let token = request
            .metadata()
            .get("x-token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        self.tokens.lock().unwrap().push(token);
        let mut inbound = request.into_inner();
        let requests = self.requests.clone();
        let mut snapshot = self.snapshot.clone();
        snapshot.mark_changed();
        let mut generation = self.generation.clone();
        generation.borrow_and_update();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            // A client may close its side and still read: the responses go
            // on until the client goes away.
            let mut reading = true;
            loop {
                tokio::select! {
                    message = inbound.message(), if reading => match message {
                        Ok(Some(r)) => requests.lock().unwrap().push(r),
                        Ok(None) => reading = false,
                        Err(_) => return,
                    },
                    changed = snapshot.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        let current = snapshot.borrow_and_update().clone();
                        if let Some(response) = current {
                            if tx.send(Ok(response)).await.is_err() {
                                return;
                            }
                        }
                    }
                    _ = generation.changed() => {
                        let _ = tx.send(Err(Status::unavailable("the control plane restarts"))).await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

struct ControlPlane {
    port: u16,
    ads: Ads,
    snapshot: watch::Sender<Option<DiscoveryResponse>>,
    generation: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl ControlPlane {
    /// Serves on `port` (0: any), with the gRPC server's TLS and client SAN
    /// check read from `vars` as the service reads its own.
    async fn start(port: u16, vars: &[(&str, &str)]) -> ControlPlane {
        let lookup = lookup(vars);
        let tls = tls::server_tls_from_vars(&lookup).expect("server TLS");
        let san = tls::client_san_from_vars(&lookup).expect("client SAN");
        // A port just freed may stay taken a moment (a socket of the
        // process that had it, or of another test): poll until it binds.
        let started = std::time::Instant::now();
        let listener = loop {
            match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
                Ok(l) => break l,
                Err(e)
                    if e.kind() == std::io::ErrorKind::AddrInUse
                        && started.elapsed() < PATIENCE =>
                {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(e) => panic!("bind the control plane on port {port}: {e}"),
            }
        };
        let port = listener.local_addr().unwrap().port();
        let (snapshot, snapshot_rx) = watch::channel(None);
        let (generation, generation_rx) = watch::channel(0);
        let ads = Ads {
            requests: Arc::default(),
            tokens: Arc::default(),
            snapshot: snapshot_rx,
            generation: generation_rx,
        };
        let mut server = Server::builder();
        if let Some(tls) = tls {
            server = server.tls_config(tls).expect("tls_config");
        }
        let service = AggregatedDiscoveryServiceServer::with_interceptor(
            ads.clone(),
            tls::client_san_interceptor(san),
        );
        let router = server.add_service(service);
        let task = tokio::spawn(async move {
            let _ = router
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await;
        });
        ControlPlane {
            port,
            ads,
            snapshot,
            generation,
            task,
        }
    }

    /// Makes `resources` the snapshot, as version `version` with `nonce`.
    fn push(&self, version: &str, nonce: &str, resources: Vec<prost_types::Any>) {
        self.snapshot.send_replace(Some(DiscoveryResponse {
            version_info: version.into(),
            resources,
            type_url: RATE_LIMIT_CONFIG_TYPE.into(),
            nonce: nonce.into(),
            ..Default::default()
        }));
    }

    fn requests(&self) -> Vec<DiscoveryRequest> {
        self.ads.requests.lock().unwrap().clone()
    }

    /// Waits for request number `n` (1-based) and returns it.
    async fn request(&self, n: usize) -> DiscoveryRequest {
        wait_for(&format!("DiscoveryRequest #{n}"), || async {
            self.requests().len() >= n
        })
        .await;
        self.requests()[n - 1].clone()
    }

    /// Fails every open stream.
    fn break_streams(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    /// Stops listening (the port is free again once this returns) and ends
    /// every stream, as a control plane process exiting does.
    async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

// ---------------------------------------------------------------------------
// Resources and what the client saw.

/// One RateLimitConfig: domain `domain`, descriptor `key` (any value) with
/// `n` per `unit`.
fn resource(name: &str, domain: &str, key: &str, unit: RateLimitUnit, n: u32) -> prost_types::Any {
    let config = RateLimitConfig {
        name: name.into(),
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            key: key.into(),
            rate_limit: Some(RateLimitPolicy {
                unit: unit as i32,
                requests_per_unit: n,
                ..Default::default()
            }),
            ..Default::default()
        }],
    };
    prost_types::Any {
        type_url: RATE_LIMIT_CONFIG_TYPE.into(),
        value: config.encode_to_vec(),
    }
}

/// Every call of `on_change`, in order.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Result<Config, ConfigError>>>>);

impl Seen {
    fn callback(&self) -> impl Fn(Result<Config, ConfigError>) + Send + Sync + 'static {
        let seen = self.0.clone();
        move |r| seen.lock().unwrap().push(r)
    }

    /// Waits for call number `n` (1-based), then applies `f` to it.
    async fn nth<T>(&self, n: usize, f: impl FnOnce(&Result<Config, ConfigError>) -> T) -> T {
        wait_for(&format!("on_change call #{n}"), || async {
            self.0.lock().unwrap().len() >= n
        })
        .await;
        f(&self.0.lock().unwrap()[n - 1])
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// The limit the configuration gives domain `d`, descriptor `k`.
fn limit_of(r: &Result<Config, ConfigError>) -> (u32, Unit) {
    let config = r.as_ref().expect("a configuration, not an error");
    let m = config
        .get_limit("d", &[("k", "anything")])
        .expect("a limit for d/k");
    (m.limits[0].requests_per_unit, m.limits[0].unit)
}

/// Client settings for a control plane on `port`, with fast retries.
fn client_vars(port: u16, host: &str, extra: &[(&str, &str)]) -> XdsSettings {
    let url = format!("{host}:{port}");
    let mut vars = vec![
        ("CONFIG_GRPC_XDS_SERVER_URL", url.as_str()),
        ("CONFIG_GRPC_XDS_NODE_ID", "test-node"),
        ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=a,tier=gold"),
        (
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            "x-token:secret",
        ),
        ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "50ms"),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "20ms"),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "100ms"),
    ];
    vars.extend_from_slice(extra);
    XdsSettings::from_vars(&lookup(&vars)).expect("client settings")
}

fn assert_ack(r: &DiscoveryRequest, version: &str, nonce: &str) {
    assert_eq!(r.type_url, RATE_LIMIT_CONFIG_TYPE);
    assert_eq!(
        (r.version_info.as_str(), r.response_nonce.as_str()),
        (version, nonce),
        "{r:?}"
    );
    assert!(r.error_detail.is_none(), "an ACK with an error: {r:?}");
}

// ---------------------------------------------------------------------------
// Tests.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takes_good_configurations_and_refuses_bad_ones() {
    let cp = ControlPlane::start(0, &[]).await;
    let seen = Seen::default();
    let client = xds::spawn(client_vars(cp.port, "127.0.0.1", &[]), seen.callback());

    // The subscription: this node, every RateLimitConfig, nothing taken yet.
    let first = cp.request(1).await;
    let node = first.node.as_ref().expect("the node");
    assert_eq!(node.id, "test-node");
    let metadata = &node.metadata.as_ref().expect("node metadata").fields;
    let zone = metadata.get("zone").and_then(|v| v.kind.clone());
    assert_eq!(
        zone,
        Some(prost_types::value::Kind::StringValue("a".into()))
    );
    assert_eq!(metadata.len(), 2);
    assert!(first.resource_names.is_empty(), "a wildcard subscription");
    assert_ack(&first, "", "");
    assert_eq!(
        cp.ads.tokens.lock().unwrap().clone(),
        vec![Some("secret".to_string())]
    );

    // A configuration that loads: handed over, then ACKed.
    cp.push(
        "v1",
        "n1",
        vec![resource("rl", "d", "k", RateLimitUnit::Minute, 10)],
    );
    assert_eq!(seen.nth(1, limit_of).await, (10, Unit::Minute));
    assert_ack(&cp.request(2).await, "v1", "n1");

    // A new version replaces it.
    cp.push(
        "v2",
        "n2",
        vec![resource("rl", "d", "k", RateLimitUnit::Hour, 20)],
    );
    assert_eq!(seen.nth(2, limit_of).await, (20, Unit::Hour));
    assert_ack(&cp.request(3).await, "v2", "n2");

    // One that does not load: the error goes to on_change, the NACK carries
    // the version still in use, the refused response's nonce and the error.
    cp.push(
        "v3",
        "n3",
        vec![
            resource("good", "other", "k", RateLimitUnit::Second, 1),
            resource("rl", "d", "k", RateLimitUnit::Unknown, 5),
        ],
    );
    let message = seen
        .nth(3, |r| match r {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a configuration where an error was due"),
        })
        .await;
    assert!(message.starts_with("xds:rl: "), "{message}");
    assert!(
        message.contains("'UNKNOWN'") && message.contains("descriptors[0].rate_limit.unit"),
        "{message}"
    );
    let nack = cp.request(4).await;
    assert_eq!(
        (nack.version_info.as_str(), nack.response_nonce.as_str()),
        ("v2", "n3")
    );
    let detail = nack.error_detail.expect("a NACK's error_detail");
    assert_eq!(detail.message, message);
    assert_eq!(detail.code, 3, "INVALID_ARGUMENT");

    // A resource of another type is refused the same way.
    let cluster = prost_types::Any {
        type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
        value: Vec::new(),
    };
    cp.push("v4", "n4", vec![cluster]);
    seen.nth(4, |r| assert!(r.is_err())).await;
    let nack = cp.request(5).await;
    assert_eq!(
        (nack.version_info.as_str(), nack.response_nonce.as_str()),
        ("v2", "n4")
    );
    assert!(nack.error_detail.is_some());

    // And the next good one is taken.
    cp.push(
        "v5",
        "n5",
        vec![resource("rl", "d", "k", RateLimitUnit::Day, 30)],
    );
    assert_eq!(seen.nth(5, limit_of).await, (30, Unit::Day));
    assert_ack(&cp.request(6).await, "v5", "n5");

    // An empty snapshot is a configuration too (no domains), as in the
    // reference.
    cp.push("v6", "n6", Vec::new());
    assert!(seen.nth(6, |r| r.as_ref().unwrap().is_empty()).await);
    assert_ack(&cp.request(7).await, "v6", "n6");

    client.abort();
    assert_eq!(seen.len(), 6);
    assert_eq!(cp.requests().len(), 7, "{:?}", cp.requests());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_and_resubscribes_with_the_version_taken() {
    // The client starts before the control plane listens: it keeps trying.
    // The port comes from the kernel's ephemeral range, where no test's
    // server is started by number.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let seen = Seen::default();
    let client = xds::spawn(client_vars(port, "127.0.0.1", &[]), seen.callback());
    let cp = ControlPlane::start(port, &[]).await;
    cp.push(
        "v1",
        "n1",
        vec![resource("rl", "d", "k", RateLimitUnit::Minute, 10)],
    );
    assert_eq!(seen.nth(1, limit_of).await, (10, Unit::Minute));
    let ack = wait_ack(&cp, "n1").await;
    assert_ack(&ack, "v1", "n1");

    // The stream fails: a new one subscribes again, saying what it runs.
    let before = cp.requests().len();
    cp.break_streams();
    let resubscribe = cp.request(before + 1).await;
    assert_eq!(resubscribe.node.as_ref().unwrap().id, "test-node");
    assert_ack(&resubscribe, "v1", "");
    // The snapshot it is sent again is taken again (the same version).
    assert_eq!(seen.nth(2, limit_of).await, (10, Unit::Minute));
    assert_ack(&cp.request(before + 2).await, "v1", "n1");
    assert_eq!(cp.ads.tokens.lock().unwrap().len(), 2, "two streams");

    // A whole new control plane process on the same port.
    cp.stop().await;
    let cp = ControlPlane::start(port, &[]).await;
    cp.push(
        "v2",
        "n7",
        vec![resource("rl", "d", "k", RateLimitUnit::Hour, 3)],
    );
    assert_eq!(seen.nth(3, limit_of).await, (3, Unit::Hour));
    assert_ack(&cp.request(1).await, "v1", "");
    assert_ack(&wait_ack(&cp, "n7").await, "v2", "n7");
    client.abort();
}

/// Waits for the request answering the response with `nonce`.
async fn wait_ack(cp: &ControlPlane, nonce: &str) -> DiscoveryRequest {
    wait_for(&format!("the answer to nonce {nonce}"), || async {
        cp.requests().iter().any(|r| r.response_nonce == nonce)
    })
    .await;
    cp.requests()
        .into_iter()
        .find(|r| r.response_nonce == nonce)
        .unwrap()
}

// ---------------------------------------------------------------------------
// TLS.

/// A CA, a server certificate for `localhost` and 127.0.0.1, and client
/// certificates for `envoy-ratelimit`: one from the CA, one from a CA
/// nobody trusts. Made by the openssl CLI, valid for two days.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new() -> Pki {
        let dir = harness::temp_dir("pki");
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        for ca in ["ca", "rogue-ca"] {
            let mut args = vec!["req", "-x509"];
            args.extend_from_slice(&ec);
            let (key, crt, subj) = (
                format!("{ca}.key"),
                format!("{ca}.crt"),
                format!("/CN=test {ca}"),
            );
            args.extend_from_slice(&[
                "-keyout",
                &key,
                "-out",
                &crt,
                "-days",
                "2",
                "-subj",
                &subj,
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ]);
            openssl(&args);
        }
        let leaf = |name: &str, ca: &str, san: &str, usage: &str| {
            let (key, csr, crt, ext) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.ext"),
            );
            std::fs::write(
                dir.join(&ext),
                format!(
                    "subjectAltName={san}\nextendedKeyUsage={usage}\nbasicConstraints=CA:FALSE\n"
                ),
            )
            .unwrap();
            let mut args = vec!["req"];
            args.extend_from_slice(&ec);
            args.extend_from_slice(&["-keyout", &key, "-out", &csr, "-subj", "/CN=leaf"]);
            openssl(&args);
            let (ca_crt, ca_key) = (format!("{ca}.crt"), format!("{ca}.key"));
            openssl(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &ca_crt,
                "-CAkey",
                &ca_key,
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                &ext,
            ]);
        };
        leaf("server", "ca", "DNS:localhost,IP:127.0.0.1", "serverAuth");
        leaf("client", "ca", "DNS:envoy-ratelimit", "clientAuth");
        leaf("rogue", "rogue-ca", "DNS:envoy-ratelimit", "clientAuth");
        Pki { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    /// The gRPC server variables: TLS with `server.crt`, clients must show a
    /// certificate from `ca.crt` valid for `san`.
    fn server_vars(&self, san: &str) -> Vec<(String, String)> {
        vec![
            ("GRPC_SERVER_USE_TLS".into(), "true".into()),
            ("GRPC_SERVER_TLS_CERT".into(), self.path("server.crt")),
            ("GRPC_SERVER_TLS_KEY".into(), self.path("server.key")),
            ("GRPC_CLIENT_TLS_CACERT".into(), self.path("ca.crt")),
            ("GRPC_CLIENT_TLS_SAN".into(), san.into()),
        ]
    }

    /// The xDS client variables, presenting `who`'s certificate.
    fn client_vars(&self, who: &str) -> Vec<(String, String)> {
        vec![
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS".into(), "true".into()),
            (
                "CONFIG_GRPC_XDS_CLIENT_TLS_CERT".into(),
                self.path(&format!("{who}.crt")),
            ),
            (
                "CONFIG_GRPC_XDS_CLIENT_TLS_KEY".into(),
                self.path(&format!("{who}.key")),
            ),
            (
                "CONFIG_GRPC_XDS_SERVER_TLS_CACERT".into(),
                self.path("ca.crt"),
            ),
        ]
    }

    fn client_tls(&self, who: Option<&str>, ca: &str) -> ClientTlsConfig {
        let read = |f: &str| std::fs::read(self.dir.join(f)).unwrap();
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(&format!("{ca}.crt"))))
            .domain_name("localhost");
        if let Some(who) = who {
            tls = tls.identity(Identity::from_pem(
                read(&format!("{who}.crt")),
                read(&format!("{who}.key")),
            ));
        }
        tls
    }
}

fn borrowed(vars: &[(String, String)]) -> Vec<(&str, &str)> {
    vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// Opens a stream to the control plane with `tls` and reads the first
/// response: the error, if the connection or the call is refused.
async fn try_subscribe(port: u16, tls: ClientTlsConfig) -> Result<(), String> {
    let channel = Channel::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let request = DiscoveryRequest {
        type_url: RATE_LIMIT_CONFIG_TYPE.into(),
        ..Default::default()
    };
    let mut responses = AggregatedDiscoveryServiceClient::new(channel)
        .stream_aggregated_resources(tokio_stream::iter(vec![request]))
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
        .into_inner();
    match responses.message().await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err("no response".into()),
        Err(s) => Err(format!("{:?}: {}", s.code(), s.message())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_on_both_ends() {
    let pki = Pki::new();
    let server = pki.server_vars("envoy-ratelimit");
    let cp = ControlPlane::start(0, &borrowed(&server)).await;
    cp.push(
        "v1",
        "n1",
        vec![resource("rl", "d", "k", RateLimitUnit::Second, 4)],
    );

    // The xDS client with the reference's variables: over TLS, presenting
    // its certificate, checking the server's against the CA and the host of
    // CONFIG_GRPC_XDS_SERVER_URL.
    let seen = Seen::default();
    let client_vars = pki.client_vars("client");
    let settings = client_vars_tls(cp.port, "localhost", &client_vars);
    assert!(settings.uri.starts_with("https://"), "{}", settings.uri);
    let client = xds::spawn(settings, seen.callback());
    assert_eq!(seen.nth(1, limit_of).await, (4, Unit::Second));
    assert_ack(&wait_ack(&cp, "n1").await, "v1", "n1");
    client.abort();

    // CONFIG_GRPC_XDS_SERVER_TLS_SAN names the server when the URL's host
    // is not in its certificate.
    let mut with_san = pki.client_vars("client");
    with_san.push(("CONFIG_GRPC_XDS_SERVER_TLS_SAN".into(), "localhost".into()));
    let seen = Seen::default();
    let client = xds::spawn(
        client_vars_tls(cp.port, "127.0.0.1", &with_san),
        seen.callback(),
    );
    assert_eq!(seen.nth(1, limit_of).await, (4, Unit::Second));
    // on_change runs before the ACK is sent: the ACK is waited for too, so
    // that no request of this client arrives after the count below.
    wait_for("the second client's ACK", || async {
        let acks = cp.requests();
        acks.iter().filter(|r| r.response_nonce == "n1").count() >= 2
    })
    .await;
    client.abort();

    // What the server refuses, each seen by the client that tries. Two
    // requests per xDS client so far, and this client's one.
    assert_eq!(
        try_subscribe(cp.port, pki.client_tls(Some("client"), "ca")).await,
        Ok(())
    );
    let accepted = 5;
    cp.request(accepted).await;
    let no_cert = try_subscribe(cp.port, pki.client_tls(None, "ca")).await;
    assert!(no_cert.is_err(), "a client without a certificate got in");
    let rogue = try_subscribe(cp.port, pki.client_tls(Some("rogue"), "ca")).await;
    assert!(rogue.is_err(), "a certificate from another CA got in");
    // The client refuses a server whose certificate it cannot verify.
    let untrusted = try_subscribe(cp.port, pki.client_tls(Some("client"), "rogue-ca")).await;
    let untrusted = untrusted.expect_err("a server from an untrusted CA was taken");
    assert!(untrusted.contains("UnknownIssuer"), "{untrusted}");
    assert_eq!(
        cp.requests().len(),
        accepted,
        "a refused client's request arrived"
    );

    // GRPC_CLIENT_TLS_SAN: a certificate from the CA but for another name
    // is refused on every call.
    let other = pki.server_vars("someone-else");
    let strict = ControlPlane::start(0, &borrowed(&other)).await;
    strict.push(
        "v1",
        "n1",
        vec![resource("rl", "d", "k", RateLimitUnit::Second, 4)],
    );
    let refused = try_subscribe(strict.port, pki.client_tls(Some("client"), "ca")).await;
    let refused = refused.expect_err("a client certificate for another name got in");
    assert!(
        refused.contains("Unauthenticated") && refused.contains("someone-else"),
        "{refused}"
    );
    assert!(strict.requests().is_empty());
}

fn client_vars_tls(port: u16, host: &str, vars: &[(String, String)]) -> XdsSettings {
    client_vars(port, host, &borrowed(vars))
}

#[test]
fn tls_variables_are_checked_at_start() {
    let pki = Pki::new();
    let (crt, key, ca) = (
        pki.path("server.crt"),
        pki.path("server.key"),
        pki.path("ca.crt"),
    );
    let client_key = pki.path("client.key");
    let server = |vars: &[(&str, &str)]| tls::server_tls_from_vars(&lookup(vars));
    assert!(server(&[]).unwrap().is_none());
    assert!(server(&[
        ("GRPC_SERVER_USE_TLS", "false"),
        ("GRPC_SERVER_TLS_CERT", "/nope")
    ])
    .unwrap()
    .is_none());
    assert!(server(&[
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", &crt),
        ("GRPC_SERVER_TLS_KEY", &key)
    ])
    .unwrap()
    .is_some());
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("GRPC_SERVER_USE_TLS", "yes")], "GRPC_SERVER_USE_TLS"),
        (
            &[("GRPC_SERVER_USE_TLS", "true")],
            "GRPC_SERVER_USE_TLS=true needs",
        ),
        (
            &[("GRPC_SERVER_USE_TLS", "1"), ("GRPC_SERVER_TLS_CERT", &crt)],
            "GRPC_SERVER_TLS_CERT is set but not GRPC_SERVER_TLS_KEY",
        ),
        (
            &[
                ("GRPC_SERVER_USE_TLS", "1"),
                ("GRPC_SERVER_TLS_CERT", "/nonexistent.crt"),
                ("GRPC_SERVER_TLS_KEY", &key),
            ],
            "GRPC_SERVER_TLS_CERT=/nonexistent.crt: ",
        ),
        (
            &[
                ("GRPC_SERVER_USE_TLS", "1"),
                ("GRPC_SERVER_TLS_CERT", &key),
                ("GRPC_SERVER_TLS_KEY", &key),
            ],
            "GRPC_SERVER_TLS_CERT=",
        ),
        (
            &[
                ("GRPC_SERVER_USE_TLS", "1"),
                ("GRPC_SERVER_TLS_CERT", &crt),
                ("GRPC_SERVER_TLS_KEY", &crt),
            ],
            "GRPC_SERVER_TLS_KEY=",
        ),
        (
            &[
                ("GRPC_SERVER_USE_TLS", "1"),
                ("GRPC_SERVER_TLS_CERT", &crt),
                ("GRPC_SERVER_TLS_KEY", &key),
                ("GRPC_CLIENT_TLS_CACERT", &key),
            ],
            "GRPC_CLIENT_TLS_CACERT=",
        ),
        (
            &[
                ("GRPC_SERVER_USE_TLS", "1"),
                ("GRPC_SERVER_TLS_CERT", &crt),
                ("GRPC_SERVER_TLS_KEY", &client_key),
            ],
            "GRPC_SERVER_TLS_CERT/GRPC_SERVER_TLS_KEY: ",
        ),
    ];
    for (vars, expected) in cases {
        let err = server(vars).expect_err(expected);
        assert!(err.starts_with(expected), "{vars:?}: {err}");
    }

    let san = |vars: &[(&str, &str)]| tls::client_san_from_vars(&lookup(vars));
    assert!(
        san(&[("GRPC_CLIENT_TLS_SAN", "x")]).unwrap().is_none(),
        "no TLS, no check"
    );
    let err = san(&[
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_CLIENT_TLS_SAN", "x"),
    ])
    .unwrap_err();
    assert!(
        err.starts_with("GRPC_CLIENT_TLS_SAN=x needs GRPC_CLIENT_TLS_CACERT"),
        "{err}"
    );
    let err = san(&[
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_CLIENT_TLS_CACERT", &ca),
        ("GRPC_CLIENT_TLS_SAN", "not a name"),
    ])
    .unwrap_err();
    assert!(err.starts_with("GRPC_CLIENT_TLS_SAN=not a name: "), "{err}");

    let client =
        |vars: &[(&str, &str)]| XdsSettings::from_vars(&lookup(vars)).map(|s| s.tls.is_some());
    assert_eq!(client(&[]), Ok(false));
    assert_eq!(
        client(&[("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true")]),
        Ok(true),
        "system roots"
    );
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[
                ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
                ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", &key),
            ],
            "CONFIG_GRPC_XDS_CLIENT_TLS_KEY is set but not CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        ),
        (
            &[
                ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
                ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/none"),
            ],
            "CONFIG_GRPC_XDS_SERVER_TLS_CACERT=/none: ",
        ),
        (
            &[
                ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
                ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "a b"),
            ],
            "CONFIG_GRPC_XDS_SERVER_TLS_SAN=a b: ",
        ),
    ];
    for (vars, expected) in cases {
        let err = client(vars).expect_err(expected);
        assert!(err.starts_with(expected), "{vars:?}: {err}");
    }
    // A key that is not the certificate's.
    let (client_crt, server_key) = (pki.path("client.crt"), pki.path("server.key"));
    let err = client(&[
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", &client_crt),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", &server_key),
    ])
    .expect_err("a key that is not the certificate's");
    assert!(
        err.starts_with("CONFIG_GRPC_XDS_CLIENT_TLS_CERT/CONFIG_GRPC_XDS_CLIENT_TLS_KEY: "),
        "{err}"
    );
}

// ---------------------------------------------------------------------------
// The binary, as Envoy Gateway runs it.

/// A channel to the binary's gRPC port over TLS, presenting `client.crt`.
async fn rls_client(
    pki: &Pki,
    port: u16,
) -> redis_ratelimit_rls::proto::rate_limit_service_client::RateLimitServiceClient<Channel> {
    let channel = Channel::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .tls_config(pki.client_tls(Some("client"), "ca"))
        .unwrap()
        .connect()
        .await
        .expect("connect to the service over TLS");
    redis_ratelimit_rls::proto::rate_limit_service_client::RateLimitServiceClient::new(channel)
}

/// Waits, when the current hour has less than a minute left, for the next
/// one: the test counts in one fixed hour window (the server's clock is
/// this machine's).
async fn settle_in_hour() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let left = 3600 - now % 3600;
    if left < 60 {
        tokio::time::sleep(Duration::from_secs(left + 1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_decides_with_what_the_control_plane_sends() {
    if redis_ratelimit_rls::settings::IGNORED.contains(&"CONFIG_TYPE") {
        eprintln!(
            "skipped: this build of redis-ratelimit-rls ignores CONFIG_TYPE (the xDS wiring is not in main.rs yet)"
        );
        return;
    }
    let pki = Pki::new();
    let redis = harness::Server::start(harness::Kind::Redis);
    // The control plane: TLS, and it wants the client's certificate.
    let cp_vars = [
        ("GRPC_SERVER_USE_TLS".to_string(), "true".to_string()),
        ("GRPC_SERVER_TLS_CERT".to_string(), pki.path("server.crt")),
        ("GRPC_SERVER_TLS_KEY".to_string(), pki.path("server.key")),
        ("GRPC_CLIENT_TLS_CACERT".to_string(), pki.path("ca.crt")),
    ];
    let cp = ControlPlane::start(0, &borrowed(&cp_vars)).await;
    settle_in_hour().await;
    cp.push(
        "v1",
        "n1",
        vec![resource("rl", "d", "k", RateLimitUnit::Hour, 2)],
    );

    // Envoy Gateway's environment for its ratelimit container (its
    // GRPC_SERVER_TLS_CA_CERT is a name the reference does not read).
    let runtime = harness::Runtime::new(&[]);
    let mut env = harness::base_env(&redis.url(), &runtime);
    let url = format!("localhost:{}", cp.port);
    let (crt, key, ca) = (
        pki.path("server.crt"),
        pki.path("server.key"),
        pki.path("ca.crt"),
    );
    let (client_crt, client_key) = (pki.path("client.crt"), pki.path("client.key"));
    for (k, v) in [
        ("RUNTIME_ROOT", "/nonexistent/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("USE_STATSD", "false"),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", url.as_str()),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", crt.as_str()),
        ("GRPC_SERVER_TLS_KEY", key.as_str()),
        ("GRPC_SERVER_TLS_CA_CERT", ca.as_str()),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", client_crt.as_str()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", client_key.as_str()),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ca.as_str()),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "100ms"),
    ] {
        harness::set_env(&mut env, k, v);
    }
    let rls = harness::Rls::start(&env);
    let ack = wait_ack(&cp, "n1").await;
    assert_ack(&ack, "v1", "n1");
    assert_eq!(ack.node.as_ref().unwrap().id, "envoy-ratelimit");
    // The ACK follows the swap: the limit is in use.
    let dump = rls.http("GET", "/rlconfig", "").body;
    assert!(
        dump.contains("d.k") && dump.contains("requests_per_unit=2"),
        "{dump}"
    );

    let mut client = rls_client(&pki, rls.grpc_port).await;
    let ask = || harness::request("d", vec![harness::desc(&[("k", "x")])]);
    let code = |r: Result<tonic::Response<harness::RateLimitResponse>, Status>| {
        harness::overall(&r.expect("ShouldRateLimit").into_inner())
    };
    assert_eq!(
        code(client.should_rate_limit(ask()).await),
        harness::Code::Ok
    );
    assert_eq!(
        code(client.should_rate_limit(ask()).await),
        harness::Code::Ok
    );
    assert_eq!(
        code(client.should_rate_limit(ask()).await),
        harness::Code::OverLimit
    );

    // A new version raises the limit: the same window, 3 more.
    cp.push(
        "v2",
        "n2",
        vec![resource("rl", "d", "k", RateLimitUnit::Hour, 5)],
    );
    assert_ack(&wait_ack(&cp, "n2").await, "v2", "n2");
    assert_eq!(
        code(client.should_rate_limit(ask()).await),
        harness::Code::Ok
    );

    // A bad one is NACKed and the limits in force stay.
    cp.push(
        "v3",
        "n3",
        vec![resource("rl", "d", "k", RateLimitUnit::Unknown, 100)],
    );
    let nack = wait_ack(&cp, "n3").await;
    assert_eq!(nack.version_info, "v2");
    assert!(nack.error_detail.is_some(), "{nack:?}");
    assert_eq!(
        code(client.should_rate_limit(ask()).await),
        harness::Code::Ok
    );
    assert_eq!(
        code(client.should_rate_limit(ask()).await),
        harness::Code::Ok
    );
    assert_eq!(
        code(client.should_rate_limit(ask()).await),
        harness::Code::OverLimit
    );
    drop(rls);
}
