//! Who may lock what: a client's identity from its certificate, the rules
//! of `--acl`, and what they allow one connection (docs/security.md).
//!
//! Only a node with client certificates (`--tls-client-ca`) has
//! identities. Without them nothing here runs: connections have no
//! [`Access`], and the engine checks nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::proto::quoted;

/// Longest identity, in bytes. A grant's identity travels to the standbys
/// as the last field of `P G`, whose longest line must stay within the
/// 512 bytes of a line (see `cluster::wire`).
pub const MAX_IDENTITY: usize = 32;

/// The most rules an `--acl` file may hold.
pub const MAX_RULES: usize = 10_000;

/// The biggest `--acl` file read, in bytes.
pub const MAX_ACL_BYTES: usize = 1 << 20;

/// True for an identity this node takes: 1 to [`MAX_IDENTITY`] bytes of
/// printable ASCII without spaces (0x21 to 0x7E), and neither `-` (which
/// means "none" on the peer link) nor `*` (which means "anyone" in a rule).
pub fn is_valid_identity(identity: &[u8]) -> bool {
    !identity.is_empty()
        && identity.len() <= MAX_IDENTITY
        && identity.iter().all(|b| (0x21..=0x7e).contains(b))
        && identity != b"-"
        && identity != b"*"
}

/// The identity a client certificate (DER) names: its first URI subject
/// alternative name, else its first DNS one, else its subject's common name
/// (CN). `Err` says why there is none, in words that are safe to log: the
/// certificate names nothing usable, or the name is longer than
/// [`MAX_IDENTITY`] bytes or holds a byte no identity may hold.
///
/// The certificate was verified by rustls before this runs; this reads it
/// anyway as bytes from the network: every length is checked, nothing
/// panics.
pub fn identity_of(cert: &[u8]) -> Result<Vec<u8>, NoIdentity> {
    let Some(names) = cert_names(cert) else {
        return Err(NoIdentity::Unreadable);
    };
    let (what, name) = match (names.uri, names.dns, names.cn) {
        (Some(uri), _, _) => ("URI subject alternative name", uri),
        (None, Some(dns), _) => ("DNS subject alternative name", dns),
        (None, None, Some(cn)) => ("subject common name", cn),
        (None, None, None) => return Err(NoIdentity::Unnamed),
    };
    if !is_valid_identity(name) {
        return Err(NoIdentity::Unusable {
            what,
            name: quoted(name, 40),
        });
    }
    Ok(name.to_vec())
}

/// Why a client certificate gives no identity ([`identity_of`]); its
/// `Display` is the reason a refused client is told and the log says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoIdentity {
    /// The certificate's DER could not be read.
    Unreadable,
    /// No URI or DNS subject alternative name, no subject common name.
    Unnamed,
    /// The name found is no identity ([`is_valid_identity`]).
    Unusable {
        /// Which field of the certificate held it.
        what: &'static str,
        /// The name, quoted for a log (at most 40 bytes of it).
        name: String,
    },
}

impl std::fmt::Display for NoIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoIdentity::Unreadable => f.write_str("the client certificate could not be read"),
            NoIdentity::Unnamed => f.write_str(
                "the client certificate names no identity (no URI or DNS subject alternative \
                 name, no subject common name)",
            ),
            NoIdentity::Unusable { what, name } => write!(
                f,
                "the client certificate's {what} \"{name}\" is no usable identity (1 to \
                 {MAX_IDENTITY} printable ASCII characters without spaces, not - or *)"
            ),
        }
    }
}

impl std::error::Error for NoIdentity {}

/// What a certificate names, as found.
#[derive(Default)]
struct Names<'a> {
    uri: Option<&'a [u8]>,
    dns: Option<&'a [u8]>,
    cn: Option<&'a [u8]>,
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const OCTET_STRING: u8 = 0x04;
const BOOLEAN: u8 = 0x01;
/// `[0] EXPLICIT` version, `[3] EXPLICIT` extensions.
const VERSION_TAG: u8 = 0xa0;
const EXTENSIONS_TAG: u8 = 0xa3;
/// `GeneralName`: `[2] dNSName`, `[6] uniformResourceIdentifier`.
const DNS_NAME: u8 = 0x82;
const URI_NAME: u8 = 0x86;
/// 2.5.29.17 and 2.5.4.3.
const SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];
const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

/// One DER element off the front of `input`: `(tag, contents, rest)`.
/// `None` for anything malformed or cut short (and for multi-byte tags,
/// which no field read here has).
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    if tag & 0x1f == 0x1f {
        return None;
    }
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 {
            return None;
        }
        let (bytes, after) = (rest.get(..count)?, rest.get(count..)?);
        rest = after;
        bytes.iter().fold(0usize, |n, &b| (n << 8) | usize::from(b))
    };
    Some((tag, rest.get(..len)?, rest.get(len..)?))
}

/// The elements of a DER sequence's (or set's) contents, in order.
fn elements(mut contents: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    std::iter::from_fn(move || {
        let (tag, value, rest) = tlv(contents)?;
        contents = rest;
        Some((tag, value))
    })
}

/// Reads the names of an X.509 certificate (RFC 5280, section 4.1).
fn cert_names(cert: &[u8]) -> Option<Names<'_>> {
    let (tag, certificate, _) = tlv(cert)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, tbs, _) = tlv(certificate)?;
    if tag != SEQUENCE {
        return None;
    }
    let mut fields = elements(tbs).peekable();
    if fields.peek().is_some_and(|&(tag, _)| tag == VERSION_TAG) {
        fields.next();
    }
    // serialNumber, signature, issuer, validity, then the subject.
    let (tag, subject) = fields.nth(4)?;
    if tag != SEQUENCE {
        return None;
    }
    let mut names = Names {
        cn: common_name(subject),
        ..Names::default()
    };
    // subjectPublicKeyInfo, the optional unique IDs, then the extensions.
    for (tag, value) in fields.skip(1) {
        if tag == EXTENSIONS_TAG {
            alt_names(value, &mut names);
        }
    }
    Some(names)
}

/// The first common name of a subject (`Name`).
fn common_name(subject: &[u8]) -> Option<&[u8]> {
    elements(subject)
        .filter(|&(tag, _)| tag == SET)
        .flat_map(|(_, set)| elements(set))
        .find_map(|(tag, attribute)| {
            if tag != SEQUENCE {
                return None;
            }
            let mut parts = elements(attribute);
            let (OID, oid) = parts.next()? else {
                return None;
            };
            (oid == COMMON_NAME).then(|| parts.next().map(|(_, value)| value))?
        })
}

/// The first URI and DNS names of the subject alternative name extension.
fn alt_names<'a>(extensions: &'a [u8], names: &mut Names<'a>) {
    let Some((SEQUENCE, list, _)) = tlv(extensions) else {
        return;
    };
    for (tag, extension) in elements(list) {
        if tag != SEQUENCE {
            continue;
        }
        let mut parts = elements(extension);
        let Some((OID, oid)) = parts.next() else {
            continue;
        };
        if oid != SUBJECT_ALT_NAME {
            continue;
        }
        let value = parts.find_map(|(tag, value)| match tag {
            OCTET_STRING => Some(value),
            BOOLEAN => None,
            _ => None,
        });
        let Some((SEQUENCE, general_names, _)) = value.and_then(tlv) else {
            return;
        };
        for (tag, name) in elements(general_names) {
            match tag {
                URI_NAME if names.uri.is_none() => names.uri = Some(name),
                DNS_NAME if names.dns.is_none() => names.dns = Some(name),
                _ => {}
            }
        }
        return;
    }
}

/// One rule of an `--acl` file: `IDENTITY KEY-PREFIX RIGHTS`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    /// `None`: `*`, any certified client.
    identity: Option<Box<[u8]>>,
    /// `None`: `*`, every key.
    prefix: Option<Box<[u8]>>,
    admin: bool,
}

/// The rules of an `--acl` file (or, without one, a single rule: every
/// certified client may lock every key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    rules: Vec<Rule>,
    /// What [`Acl::access`] gave each identity, shared by its connections.
    shared: Shared,
}

/// Identities whose [`Access`] one rule set keeps for the next connection
/// of the same identity; beyond, each connection gets its own.
pub const MAX_SHARED_IDENTITIES: usize = 4096;

/// The [`Access`] of each identity [`Acl::access`] was asked for, so that
/// the connections of one identity share one copy of its prefixes. A copy
/// of the rules starts empty, and two rule sets compare by their rules.
#[derive(Default)]
struct Shared(Mutex<HashMap<Box<[u8]>, Arc<Access>>>);

impl Clone for Shared {
    fn clone(&self) -> Shared {
        Shared::default()
    }
}

impl PartialEq for Shared {
    fn eq(&self, _: &Shared) -> bool {
        true
    }
}

impl Eq for Shared {}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.lock().unwrap_or_else(PoisonError::into_inner).len();
        write!(f, "Shared({n} identities)")
    }
}

/// A line of an `--acl` file that is not a rule: its number (from 1) and
/// what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclError {
    pub line: usize,
    pub why: String,
}

impl std::fmt::Display for AclError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.why)
    }
}

impl Acl {
    /// Without `--acl`: every certified client may lock every key, and no
    /// one is admin.
    pub fn allow_all() -> Acl {
        Acl {
            rules: vec![Rule {
                identity: None,
                prefix: None,
                admin: false,
            }],
            shared: Shared::default(),
        }
    }

    /// Parses an `--acl` file: one rule a line, `IDENTITY KEY-PREFIX
    /// RIGHTS` separated by spaces or tabs; blank lines and lines whose
    /// first non-blank character is `#` are skipped. `IDENTITY` is an
    /// identity or `*` (any certified client); `KEY-PREFIX` a key prefix
    /// (1 to 250 bytes, as keys) or `*` (every key); `RIGHTS` `lock`,
    /// `admin` or `lock,admin` (`admin` needs `*` as the prefix: it is
    /// about every key).
    pub fn parse(text: &str) -> Result<Acl, AclError> {
        let mut rules = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let at = |why: String| AclError { line: i + 1, why };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_ascii_whitespace().collect();
            let [identity, prefix, rights] = fields[..] else {
                return Err(at(format!(
                    "want 3 fields (IDENTITY KEY-PREFIX RIGHTS), got {}",
                    fields.len()
                )));
            };
            if rules.len() == MAX_RULES {
                return Err(at(format!("more than {MAX_RULES} rules")));
            }
            let identity = match identity {
                "*" => None,
                id if is_valid_identity(id.as_bytes()) => Some(id.as_bytes().into()),
                id => {
                    return Err(at(format!(
                        "bad identity \"{}\" (1 to {MAX_IDENTITY} printable ASCII characters, \
                         or * for any client)",
                        quoted(id.as_bytes(), 40)
                    )));
                }
            };
            let prefix = match prefix {
                "*" => None,
                p if crate::proto::is_valid_key(p.as_bytes()) => Some(p.as_bytes().into()),
                p => {
                    return Err(at(format!(
                        "bad key prefix \"{}\" (1 to 250 bytes as in a key, or * for every key)",
                        quoted(p.as_bytes(), 40)
                    )));
                }
            };
            let mut admin = false;
            for right in rights.split(',') {
                match right {
                    "lock" => {}
                    "admin" => admin = true,
                    other => {
                        return Err(at(format!(
                            "unknown right \"{}\" (rights: lock, admin, comma-separated)",
                            quoted(other.as_bytes(), 40)
                        )));
                    }
                }
            }
            if admin && prefix.is_some() {
                return Err(at(
                    "admin is about every key: give * as its key prefix".to_string()
                ));
            }
            rules.push(Rule {
                identity,
                prefix,
                admin,
            });
        }
        Ok(Acl {
            rules,
            shared: Shared::default(),
        })
    }

    /// What the rules allow `identity` (a valid identity): one copy shared
    /// by every connection of the identity under these rules.
    pub fn access(&self, identity: &[u8]) -> Arc<Access> {
        let mut shared = self.shared.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(access) = shared.get(identity) {
            return Arc::clone(access);
        }
        let access = Arc::new(self.access_of(identity));
        if shared.len() < MAX_SHARED_IDENTITIES {
            shared.insert(identity.into(), Arc::clone(&access));
        }
        access
    }

    /// What the rules allow `identity`, made anew.
    fn access_of(&self, identity: &[u8]) -> Access {
        debug_assert!(is_valid_identity(identity));
        let mut access = Access {
            identity: identity.into(),
            admin: false,
            every_key: false,
            prefixes: Vec::new(),
        };
        for rule in &self.rules {
            if rule.identity.as_deref().is_some_and(|id| id != identity) {
                continue;
            }
            access.admin |= rule.admin;
            match &rule.prefix {
                None => access.every_key = true,
                Some(p) => {
                    if !access.prefixes.contains(p) {
                        access.prefixes.push(p.clone());
                    }
                }
            }
        }
        access
    }

    /// How many rules there are.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

/// What one connection's identity may do, fixed when its TLS handshake
/// ends (rules reloaded later apply to connections made after).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    identity: Box<[u8]>,
    /// May release and renew any grant, acquire any key, list every key.
    admin: bool,
    /// Some rule gives it `*`.
    every_key: bool,
    /// The key prefixes it may lock (without `every_key`).
    prefixes: Vec<Box<[u8]>>,
}

impl Access {
    pub fn identity(&self) -> &[u8] {
        &self.identity
    }

    pub fn is_admin(&self) -> bool {
        self.admin
    }

    /// Whether it may acquire `key`.
    pub fn may_lock(&self, key: &[u8]) -> bool {
        self.admin || self.every_key || self.prefixes.iter().any(|p| key.starts_with(p))
    }
}

#[cfg(test)]
#[path = "access_tests.rs"]
mod tests;
