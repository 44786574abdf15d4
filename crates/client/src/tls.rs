//! TLS to the server (feature `tls`): rustls with the ring provider, through
//! tokio-rustls.

use std::io;
use std::path::Path;
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

use crate::Error;
use crate::conn::{Dialer, ReadHalf, WriteHalf};

/// How the client speaks TLS: the CA it trusts for the servers'
/// certificates, the certificate it presents (for servers that require
/// one), and the name the servers' certificates must carry.
///
/// ```no_run
/// # async fn demo() -> Result<(), ringlock_client::Error> {
/// use ringlock_client::{Client, TlsConfig};
/// let tls = TlsConfig::from_pem_files("ca.pem", Some(("client.pem", "client.key")))?;
/// let client = Client::builder(["lock1.example:7171"]).tls(tls).connect().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct TlsConfig {
    config: Arc<ClientConfig>,
    server_name: Option<String>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            Error::InvalidArgument(format!(
                "cannot read certificates from {}: {e}",
                path.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "{} holds no PEM certificate",
            path.display()
        )));
    }
    Ok(certs)
}

impl TlsConfig {
    /// Trusts the CA certificates in the PEM file `ca` (only those: not the
    /// system's), and presents the certificate chain and private key of
    /// `client` (two PEM files) to servers that ask for one.
    pub fn from_pem_files(
        ca: impl AsRef<Path>,
        client: Option<(impl AsRef<Path>, impl AsRef<Path>)>,
    ) -> Result<TlsConfig, Error> {
        let ca = ca.as_ref();
        let mut roots = RootCertStore::empty();
        for cert in certs(ca)? {
            roots.add(cert).map_err(|e| {
                Error::InvalidArgument(format!("bad CA certificate in {}: {e}", ca.display()))
            })?;
        }
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::InvalidArgument(format!("TLS: {e}")))?
            .with_root_certificates(roots);
        let config = match client {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let (cert, key) = (cert.as_ref(), key.as_ref());
                let chain = certs(cert)?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    Error::InvalidArgument(format!(
                        "cannot read a private key from {}: {e}",
                        key.display()
                    ))
                })?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    Error::InvalidArgument(format!(
                        "{} and its key do not make a usable client certificate: {e}",
                        cert.display()
                    ))
                })?
            }
        };
        Ok(TlsConfig::from_rustls(Arc::new(config)))
    }

    /// A rustls configuration made by the application.
    pub fn from_rustls(config: Arc<ClientConfig>) -> TlsConfig {
        TlsConfig {
            config,
            server_name: None,
        }
    }

    /// The name every server's certificate must carry, instead of the host
    /// part of the address dialed (for nodes reached by an address their
    /// certificate does not name): a DNS name or an IP address.
    ///
    /// Infallible: the name is checked when a connection is dialed, not
    /// here. One that is neither a DNS name nor an IP address makes every
    /// dial fail with an error that says so (`"..." is not a name TLS can
    /// check a certificate against`), and the client reports the servers
    /// unreachable.
    pub fn server_name(mut self, name: impl Into<String>) -> TlsConfig {
        self.server_name = Some(name.into());
        self
    }

    fn name_for(&self, addr: &str) -> io::Result<ServerName<'static>> {
        let host = match &self.server_name {
            Some(name) => name.as_str(),
            None => match addr.rsplit_once(':') {
                Some((host, _)) => host.trim_start_matches('[').trim_end_matches(']'),
                None => addr,
            },
        };
        ServerName::try_from(host.to_string()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{host:?} is not a name TLS can check a certificate against"),
            )
        })
    }

    /// Dials `addr` and completes the TLS handshake.
    pub(crate) async fn dial(&self, addr: &str) -> io::Result<(ReadHalf, WriteHalf)> {
        let name = self.name_for(addr)?;
        let stream = TcpStream::connect(addr).await?;
        let _ = stream.set_nodelay(true);
        let tls = TlsConnector::from(self.config.clone())
            .connect(name, stream)
            .await?;
        let (rd, wr) = tokio::io::split(tls);
        Ok((Box::new(rd) as ReadHalf, Box::new(wr) as WriteHalf))
    }

    pub(crate) fn dialer(&self) -> Dialer {
        let tls = self.clone();
        Arc::new(move |addr: &str| {
            let tls = tls.clone();
            let addr = addr.to_string();
            Box::pin(async move { tls.dial(&addr).await })
        })
    }
}

/// What the message for a server certificate that does not name the
/// address dialed says to do, in Rust terms. A program that takes the name
/// another way (the `ringlock` command line: `--tls-server-name`) may put
/// its own words in its place.
pub const SERVER_NAME_HINT: &str =
    "if it holds another name, expect that one with TlsConfig::server_name";

/// Says what a TLS failure means, for error messages; `None` if `err` is
/// not one.
pub(crate) fn explain(err: &io::Error) -> Option<String> {
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    let tls = err.get_ref()?.downcast_ref::<rustls::Error>()?;
    Some(match tls {
        E::InvalidCertificate(c) => {
            let what = match c {
                C::UnknownIssuer => "is not signed by the CA given (--tls-ca)",
                C::Expired | C::ExpiredContext { .. } => "has expired",
                C::NotValidYet | C::NotValidYetContext { .. } => "is not valid yet",
                C::NotValidForName | C::NotValidForNameContext { .. } => {
                    return Some(format!(
                        "TLS: the server's certificate does not name the address dialed \
                         ({SERVER_NAME_HINT}) ({tls})"
                    ));
                }
                _ => "was refused",
            };
            format!("TLS: the server's certificate {what} ({tls})")
        }
        E::AlertReceived(A::CertificateRequired) => {
            "TLS: the server requires a client certificate (--tls-cert and --tls-key)".into()
        }
        E::AlertReceived(A::UnknownCA | A::BadCertificate) => {
            "TLS: the server does not accept our client certificate (not signed by its client CA)"
                .into()
        }
        E::AlertReceived(A::CertificateExpired) => {
            "TLS: the server refused our client certificate: it has expired".into()
        }
        E::InvalidMessage(_) => "TLS: the server did not answer in TLS (a plain-text port?)".into(),
        other => format!("TLS: {other}"),
    })
}
