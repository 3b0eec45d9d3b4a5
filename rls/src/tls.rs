//! TLS from the environment, with envoyproxy/ratelimit's variable names: the
//! gRPC server's (GRPC_SERVER_USE_TLS ...) and the xDS client's
//! (CONFIG_GRPC_XDS_SERVER_USE_TLS ...).
//!
//! Every file is read and parsed here, at start-up, so a missing file or one
//! with no PEM block in it is an error naming its variable; tonic would
//! otherwise refuse it later with no name attached.
//!
//! Differences from the reference, each on purpose:
//! - A variable that asks for something the others make impossible is an
//!   error, where the reference goes on without it: TLS on without a
//!   certificate or key, a client certificate without its key, and
//!   GRPC_CLIENT_TLS_SAN without GRPC_CLIENT_TLS_CACERT (without a client CA
//!   no client certificate is asked for, so no SAN could be checked).
//! - The server's certificate is read once; the reference also reloads it
//!   when its folder changes.
//! - With a client CA, the reference trusts the system's roots as well as
//!   the given CA for client certificates; here only the given CA.

use std::path::Path;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};
use tonic::{Request, Status};

/// Looks up an environment variable; tests pass their own.
pub type Vars<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment as [`Vars`]. A variable that is set but not
/// valid Unicode reads as unset here, and is refused by the reader of its
/// value where that matters.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The value of `name`, `None` when unset or empty (the reference's
/// envconfig treats an empty variable as its default).
pub(crate) fn var(vars: Vars<'_>, name: &str) -> Option<String> {
    vars(name).filter(|v| !v.is_empty())
}

/// A boolean as Go's strconv.ParseBool reads it (what the reference's
/// envconfig uses): 1 t T TRUE true True, 0 f F FALSE false False.
pub(crate) fn bool_var(vars: Vars<'_>, name: &str, default: bool) -> Result<bool, String> {
    match var(vars, name) {
        None => Ok(default),
        Some(v) => match v.as_str() {
            "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
            "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
            _ => Err(format!("{name}={v}: not a boolean (true or false)")),
        },
    }
}

/// The gRPC server's TLS: `None` unless GRPC_SERVER_USE_TLS is true. With
/// GRPC_CLIENT_TLS_CACERT, clients must present a certificate that CA
/// signed (mutual TLS).
pub fn server_tls_from_env() -> Result<Option<ServerTlsConfig>, String> {
    server_tls_from_vars(&process_env)
}

/// [`server_tls_from_env`] on the given variables.
pub fn server_tls_from_vars(vars: Vars<'_>) -> Result<Option<ServerTlsConfig>, String> {
    if !bool_var(vars, "GRPC_SERVER_USE_TLS", false)? {
        return Ok(None);
    }
    let identity = identity(
        vars,
        "GRPC_SERVER_TLS_CERT",
        "GRPC_SERVER_TLS_KEY",
        "GRPC_SERVER_USE_TLS=true",
    )?
    .ok_or_else(|| {
        "GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY".to_string()
    })?;
    let mut config = ServerTlsConfig::new().identity(identity);
    if let Some(ca) = ca(vars, "GRPC_CLIENT_TLS_CACERT")? {
        config = config.client_ca_root(ca);
    }
    // tonic builds the TLS acceptor here: a key that does not fit its
    // certificate is refused now, with the variables' names.
    tonic::transport::Server::builder()
        .tls_config(config.clone())
        .map_err(|e| {
            format!(
                "GRPC_SERVER_TLS_CERT/GRPC_SERVER_TLS_KEY: {}",
                error_chain(&e)
            )
        })?;
    Ok(Some(config))
}

/// An error with its sources, as one line.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// GRPC_CLIENT_TLS_SAN: the name a client's certificate must carry, checked
/// on every call by [`client_san_interceptor`]. `None` when unset or when
/// the server has no TLS.
pub fn client_san_from_env() -> Result<Option<ClientSan>, String> {
    client_san_from_vars(&process_env)
}

/// [`client_san_from_env`] on the given variables.
pub fn client_san_from_vars(vars: Vars<'_>) -> Result<Option<ClientSan>, String> {
    let Some(san) = var(vars, "GRPC_CLIENT_TLS_SAN") else {
        return Ok(None);
    };
    if !bool_var(vars, "GRPC_SERVER_USE_TLS", false)? {
        return Ok(None);
    }
    if var(vars, "GRPC_CLIENT_TLS_CACERT").is_none() {
        return Err(format!(
            "GRPC_CLIENT_TLS_SAN={san} needs GRPC_CLIENT_TLS_CACERT: without a client CA no client certificate is asked for"
        ));
    }
    ClientSan::new(&san)
        .map(Some)
        .map_err(|e| format!("GRPC_CLIENT_TLS_SAN={san}: {e}"))
}

/// A DNS name (or IP address) the client's certificate must be valid for,
/// as the reference checks GRPC_CLIENT_TLS_SAN.
#[derive(Clone, Debug)]
pub struct ClientSan {
    name: ServerName<'static>,
}

impl ClientSan {
    /// `san`: a DNS name or an IP address.
    pub fn new(san: &str) -> Result<ClientSan, String> {
        let name = ServerName::try_from(san.to_string())
            .map_err(|_| "not a DNS name or IP address".to_string())?;
        Ok(ClientSan { name })
    }

    /// Passes a call whose client certificate (already verified against
    /// the client CA by the handshake) is valid for the name; refuses it
    /// with UNAUTHENTICATED otherwise.
    pub fn check<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let certs = req
            .peer_certs()
            .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
        let leaf = certs
            .first()
            .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
        let der = CertificateDer::from(leaf.as_ref());
        let cert = webpki::EndEntityCert::try_from(&der)
            .map_err(|e| Status::unauthenticated(format!("client certificate: {e}")))?;
        cert.verify_is_valid_for_subject_name(&self.name)
            .map_err(|_| {
                Status::unauthenticated(format!(
                    "client certificate is not valid for {}",
                    self.name.to_str()
                ))
            })
    }
}

/// A tonic interceptor applying `san` (when there is one) to every call:
/// `RateLimitServiceServer::with_interceptor(service, client_san_interceptor(san))`.
pub fn client_san_interceptor(
    san: Option<ClientSan>,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone + Send + Sync + 'static {
    move |req: Request<()>| {
        if let Some(san) = &san {
            san.check(&req)?;
        }
        Ok(req)
    }
}

/// The xDS client's TLS: `None` unless CONFIG_GRPC_XDS_SERVER_USE_TLS is
/// true. CONFIG_GRPC_XDS_CLIENT_TLS_CERT and _KEY: the certificate this
/// client presents (both or neither). CONFIG_GRPC_XDS_SERVER_TLS_CACERT: the
/// CA the server's certificate must chain to (unset: the system's roots).
/// CONFIG_GRPC_XDS_SERVER_TLS_SAN: the name the server's certificate must be
/// valid for (unset: the host of CONFIG_GRPC_XDS_SERVER_URL).
pub fn xds_client_tls_from_env() -> Result<Option<ClientTlsConfig>, String> {
    xds_client_tls_from_vars(&process_env)
}

/// [`xds_client_tls_from_env`] on the given variables.
pub fn xds_client_tls_from_vars(vars: Vars<'_>) -> Result<Option<ClientTlsConfig>, String> {
    if !bool_var(vars, "CONFIG_GRPC_XDS_SERVER_USE_TLS", false)? {
        return Ok(None);
    }
    let mut config = ClientTlsConfig::new();
    if let Some(identity) = identity(
        vars,
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        "a client certificate",
    )? {
        config = config.identity(identity);
    }
    config = match ca(vars, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT")? {
        Some(ca) => config.ca_certificate(ca),
        None => config.with_native_roots(),
    };
    if let Some(san) = var(vars, "CONFIG_GRPC_XDS_SERVER_TLS_SAN") {
        if ServerName::try_from(san.as_str()).is_err() {
            return Err(format!(
                "CONFIG_GRPC_XDS_SERVER_TLS_SAN={san}: not a DNS name or IP address"
            ));
        }
        config = config.domain_name(san);
    }
    Ok(Some(config))
}

/// The certificate chain and key named by `cert_var` and `key_var`: `None`
/// when neither is set, an error when only one is.
fn identity(
    vars: Vars<'_>,
    cert_var: &str,
    key_var: &str,
    what: &str,
) -> Result<Option<Identity>, String> {
    match (var(vars, cert_var), var(vars, key_var)) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(format!("{cert_var} is set but not {key_var} ({what})")),
        (None, Some(_)) => Err(format!("{key_var} is set but not {cert_var} ({what})")),
        (Some(cert_path), Some(key_path)) => {
            let cert = read_certs(cert_var, &cert_path)?;
            let key = read(key_var, &key_path)?;
            PrivateKeyDer::from_pem_slice(&key)
                .map_err(|e| format!("{key_var}={key_path}: no PEM private key ({e})"))?;
            Ok(Some(Identity::from_pem(cert, key)))
        }
    }
}

/// The CA certificate(s) named by `name`, `None` when unset.
fn ca(vars: Vars<'_>, name: &str) -> Result<Option<Certificate>, String> {
    match var(vars, name) {
        None => Ok(None),
        Some(path) => Ok(Some(Certificate::from_pem(read_certs(name, &path)?))),
    }
}

/// A PEM file holding at least one certificate, every block of it valid.
fn read_certs(name: &str, path: &str) -> Result<Vec<u8>, String> {
    let pem = read(name, path)?;
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        cert.map_err(|e| format!("{name}={path}: {e}"))?;
        count += 1;
    }
    if count == 0 {
        return Err(format!("{name}={path}: no PEM certificate in the file"));
    }
    Ok(pem)
}

fn read(name: &str, path: &str) -> Result<Vec<u8>, String> {
    std::fs::read(Path::new(path)).map_err(|e| format!("{name}={path}: {e}"))
}
