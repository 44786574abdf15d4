//! TLS for the client port and the peer links: certificates loaded from PEM
//! files, the rustls configurations built from them, their reload, and the
//! words for TLS failures. The bytes themselves go through rustls inside
//! each connection's [`crate::io::Lifecycle`] (rustls is sans-I/O), on the
//! loop's own thread; see docs/security.md.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::access::{Acl, MAX_ACL_BYTES};

/// The files named by `--tls-cert`, `--tls-key`, `--tls-client-ca` and
/// `--tls-peer-ca`.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// With it, every client must present a certificate signed by it.
    pub client_ca: Option<PathBuf>,
    /// The CA that signs the nodes' certificates (default: `client_ca`).
    pub peer_ca: Option<PathBuf>,
    /// `--acl`: who may lock what (with `client_ca` only).
    pub acl: Option<PathBuf>,
}

/// One loading of the files: what new connections are made with.
#[derive(Debug)]
pub struct TlsConfigs {
    /// For accepted connections (clients, and peers dialing us).
    pub server: Arc<ServerConfig>,
    /// For the links this node dials to its peers (with a cluster only):
    /// they verify the peer's certificate against the peer CA and present
    /// ours.
    pub peer_client: Option<Arc<ClientConfig>>,
    /// Checks that an accepted connection presented a certificate signed by
    /// the peer CA before it may speak as a peer (with a cluster only).
    pub peer_check: Option<Arc<dyn ClientCertVerifier>>,
}

/// The node's TLS state, shared by the loop (which takes the current
/// configuration for each new connection) and the reload thread.
#[derive(Debug)]
pub struct Tls {
    files: TlsFiles,
    cluster: bool,
    current: Mutex<Arc<TlsConfigs>>,
    /// With client certificates: the rules new connections get (`--acl`,
    /// or without it every identity may lock every key).
    acl: Mutex<Option<Arc<Acl>>>,
}

impl Tls {
    /// Loads the files; `cluster`: the node has peers, so a peer CA is
    /// needed (`--tls-peer-ca`, or else `--tls-client-ca`).
    pub fn load(files: TlsFiles, cluster: bool) -> Result<Tls, String> {
        let configs = build(&files, cluster)?;
        let acl = match (&files.client_ca, &files.acl) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err("--acl needs --tls-client-ca: identities come from client \
                            certificates"
                    .into());
            }
            (Some(_), None) => Some(Arc::new(Acl::allow_all())),
            (Some(_), Some(path)) => Some(Arc::new(load_acl(path)?)),
        };
        Ok(Tls {
            files,
            cluster,
            current: Mutex::new(Arc::new(configs)),
            acl: Mutex::new(acl),
        })
    }

    /// The rules new connections get: `None` without client certificates
    /// (no identities).
    pub fn acl(&self) -> Option<Arc<Acl>> {
        match self.acl.lock() {
            Ok(a) => a.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Reads `--acl` again. On success new connections get the new rules
    /// (connections already open keep theirs) and `Ok` says how many there
    /// are; `Ok(None)` without `--acl`; on failure the old rules stay in
    /// force and the error says why (the line number with it).
    pub fn reload_acl(&self) -> Result<Option<usize>, String> {
        let Some(path) = &self.files.acl else {
            return Ok(None);
        };
        let acl = Arc::new(load_acl(path)?);
        let rules = acl.len();
        match self.acl.lock() {
            Ok(mut a) => *a = Some(acl),
            Err(poisoned) => *poisoned.into_inner() = Some(acl),
        }
        Ok(Some(rules))
    }

    /// The configurations new connections use.
    pub fn current(&self) -> Arc<TlsConfigs> {
        match self.current.lock() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Reads the files again. On success new connections use the new
    /// certificates (connections already open keep theirs); on failure the
    /// old ones stay in force and the error says why.
    pub fn reload(&self) -> Result<(), String> {
        let configs = Arc::new(build(&self.files, self.cluster)?);
        match self.current.lock() {
            Ok(mut c) => *c = configs,
            Err(poisoned) => *poisoned.into_inner() = configs,
        }
        Ok(())
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }
}

/// Reads and parses an `--acl` file; the error names the file and, for a
/// bad rule, its line.
pub fn load_acl(path: &Path) -> Result<Acl, String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path)
        .map_err(|e| format!("cannot read --acl {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_ACL_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read --acl {}: {e}", path.display()))?;
    if bytes.len() > MAX_ACL_BYTES {
        return Err(format!(
            "--acl {} is larger than {MAX_ACL_BYTES} bytes",
            path.display()
        ));
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("--acl {} is not UTF-8 text", path.display()))?;
    Acl::parse(&text).map_err(|e| format!("bad --acl {}: {e}", path.display()))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificate chain in a PEM file (at least one).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read certificates from {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

/// The private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| format!("cannot read a private key from {}: {e}", path.display()))
}

/// The CA certificates in a PEM file, as a root store.
pub fn load_roots(path: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots
            .add(cert)
            .map_err(|e| format!("bad CA certificate in {}: {e}", path.display()))?;
    }
    Ok(roots)
}

fn build(files: &TlsFiles, cluster: bool) -> Result<TlsConfigs, String> {
    let certs = load_certs(&files.cert)?;
    let key = load_key(&files.key)?;
    let client_roots = files.client_ca.as_deref().map(load_roots).transpose()?;
    let peer_roots = match (&files.peer_ca, &client_roots) {
        (Some(path), _) => Some(load_roots(path)?),
        (None, Some(roots)) => Some(roots.clone()),
        (None, None) => None,
    };
    let peer_roots = match (cluster, peer_roots) {
        (false, _) => None,
        (true, Some(roots)) => Some(Arc::new(roots)),
        (true, None) => {
            return Err(
                "with --peers and TLS, peer links are TLS too and each node must prove \
                 itself with a certificate: give --tls-peer-ca PATH (the CA that signs the \
                 nodes' certificates), or --tls-client-ca if the same CA signs them"
                    .into(),
            );
        }
    };
    // Accepted connections: clients must present a certificate signed by
    // the client CA if there is one; peers present theirs, signed by the
    // peer CA, so that CA is trusted too (and checked for peer lines, see
    // `peer_check`).
    let mut accepted = RootCertStore::empty();
    if let Some(roots) = &client_roots {
        accepted.roots.extend(roots.roots.iter().cloned());
    }
    if let Some(roots) = &peer_roots {
        accepted.roots.extend(roots.roots.iter().cloned());
    }
    let verifier = if accepted.is_empty() {
        WebPkiClientVerifier::no_client_auth()
    } else {
        let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(accepted), provider());
        let builder = if client_roots.is_some() {
            builder
        } else {
            // No client CA: clients come without certificates; only peers
            // must have one.
            builder.allow_unauthenticated()
        };
        builder
            .build()
            .map_err(|e| format!("cannot use the CA certificates: {e}"))?
    };
    let server = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs.clone(), key.clone_key())
        .map_err(|e| {
            format!(
                "{} and {} do not make a usable certificate and key: {e}",
                files.cert.display(),
                files.key.display()
            )
        })?;
    let (peer_client, peer_check) = match peer_roots {
        None => (None, None),
        Some(roots) => {
            let server_verifier =
                WebPkiServerVerifier::builder_with_provider(roots.clone(), provider())
                    .build()
                    .map_err(|e| format!("cannot use the peer CA: {e}"))?;
            let client = ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("TLS: {e}"))?
                .with_webpki_verifier(server_verifier)
                .with_client_auth_cert(certs, key)
                .map_err(|e| format!("cannot present our certificate to peers: {e}"))?;
            let check = WebPkiClientVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|e| format!("cannot use the peer CA: {e}"))?;
            (Some(Arc::new(client)), Some(check))
        }
    };
    Ok(TlsConfigs {
        server: Arc::new(server),
        peer_client,
        peer_check,
    })
}

/// The name a dialed peer's certificate must carry: the host part of its
/// address as `--peers` spells it (a DNS name or an IP address).
pub fn peer_server_name(addr: &str) -> Result<ServerName<'static>, String> {
    let host = match addr.rsplit_once(':') {
        Some((host, _port)) => host.trim_start_matches('[').trim_end_matches(']'),
        None => addr,
    };
    ServerName::try_from(host.to_string())
        .map_err(|_| format!("peer address {addr:?} has no usable host name for TLS"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_names_come_from_the_host_part() {
        assert!(matches!(
            peer_server_name("127.0.0.1:7171"),
            Ok(ServerName::IpAddress(_))
        ));
        assert!(matches!(
            peer_server_name("[::1]:7171"),
            Ok(ServerName::IpAddress(_))
        ));
        assert!(matches!(
            peer_server_name("node-1.example:7171"),
            Ok(ServerName::DnsName(_))
        ));
        assert!(peer_server_name("bad name:1").is_err());
    }
}
