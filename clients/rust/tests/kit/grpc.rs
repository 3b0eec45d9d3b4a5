//! The layer in a real tonic server, called by a real tonic client over
//! HTTP/2: a denial is `RESOURCE_EXHAUSTED`, with the fields in metadata.

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use redis_ratelimit_client::{Client, Limiter, RateLimitLayer, Rule};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::NamedService;
use tonic::{Code, Status};

use crate::harness::{free_port, wait_for, Kind, Server};

/// Messages as raw bytes: no protobuf needed to make a call.
struct Raw;

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// A service that answers every call with an empty message.
#[derive(Clone)]
struct Echo;

impl NamedService for Echo {
    const NAME: &'static str = "test.Echo";
}

impl tower::Service<http::Request<tonic::body::Body>> for Echo {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, _: http::Request<tonic::body::Body>) -> Self::Future {
        // An empty message (flag 0, length 0), then grpc-status 0.
        let frame = tonic::body::Body::new(http_body_util::Full::new(Bytes::from_static(&[0; 5])));
        let mut response = http::Response::new(frame);
        response
            .headers_mut()
            .insert("content-type", "application/grpc".parse().unwrap());
        response
            .headers_mut()
            .insert("grpc-status", "0".parse().unwrap());
        ready(Ok(response))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tonic_client_sees_resource_exhausted_with_retry_after_in_metadata() {
    let server = Server::start(Kind::Redis);
    let client = Client::standalone(&server.url()).await.unwrap();
    let limiter = Limiter::builder(client)
        .deadline(Duration::from_secs(5))
        .build();
    let layer = RateLimitLayer::builder(limiter)
        .key(|req| {
            req.headers
                .get("x-tenant")
                .and_then(|v| v.to_str().ok())
                .map(String::from)
        })
        .rule(Rule::token_bucket(1, 1, 60_000).name("per-tenant"))
        .grpc(true)
        .build()
        .await
        .unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(Echo)
            .serve(addr),
    );
    let url = format!("http://127.0.0.1:{port}");
    let mut channel = None;
    wait_for("the gRPC server", async || {
        channel = tonic::transport::Channel::from_shared(url.clone())
            .unwrap()
            .connect()
            .await
            .ok();
        channel.is_some()
    })
    .await;
    let mut grpc = tonic::client::Grpc::new(channel.unwrap());
    let mut call = async || {
        grpc.ready().await.unwrap();
        let mut request = tonic::Request::new(Bytes::new());
        request
            .metadata_mut()
            .insert("x-tenant", "acme".parse().unwrap());
        grpc.unary(request, "/test.Echo/Call".parse().unwrap(), Raw)
            .await
    };
    let admitted = call().await.unwrap();
    assert_eq!(
        admitted.metadata().get("ratelimit-policy").unwrap(),
        "\"per-tenant\";q=1;w=60"
    );
    let denied = call().await.unwrap_err();
    assert_eq!(denied.code(), Code::ResourceExhausted, "{denied:?}");
    assert_eq!(denied.message(), "rate limit exceeded");
    let meta = denied.metadata();
    assert_eq!(meta.get("retry-after").unwrap(), "60");
    assert_eq!(meta.get("ratelimit").unwrap(), "\"per-tenant\";r=0;t=60");
    assert_eq!(meta.get("violated-policies").unwrap(), "per-tenant");
}
