"""TLS to the nodes, with the standard library's ``ssl`` (docs/python.md,
"TLS"): TLS 1.2 or 1.3, the server's certificate always verified, its name
checked against the host of the address dialed (or one override), and a
client certificate for nodes that require one (``--tls-client-ca``)."""

from __future__ import annotations

import os
import ssl
from typing import Mapping, Optional, Union

from .errors import InvalidArgument

__all__ = ["TlsConfig"]

ENV_CA = "RINGLOCK_TLS_CA"
ENV_CERT = "RINGLOCK_TLS_CERT"
ENV_KEY = "RINGLOCK_TLS_KEY"
ENV_SERVER_NAME = "RINGLOCK_TLS_SERVER_NAME"

_TLS12 = ssl.TLSVersion.TLSv1_2
_TLS13 = ssl.TLSVersion.TLSv1_3


class TlsConfig:
    """How the client speaks TLS.

    ``ca``: a PEM file of the CA certificates that sign the nodes'
    certificates (only those are trusted, not the system's). ``cert`` and
    ``key``: this client's certificate (chain) and private key, PEM, for
    nodes that require a client certificate (both or neither).
    ``server_name``: the name every node's certificate must carry, instead
    of the host of the address dialed. The files are read here: a missing or
    unusable file raises InvalidArgument at once.

    ``TlsConfig.from_context(ctx)`` takes an ``ssl.SSLContext`` made by the
    application instead (it must verify certificates); ``TlsConfig.from_env()``
    reads ``RINGLOCK_TLS_*`` like the ``ringlock`` CLI.
    """

    __slots__ = ("_context", "server_name", "ca", "cert", "key")

    def __init__(
        self,
        ca: "Union[str, os.PathLike[str]]",
        cert: "Optional[Union[str, os.PathLike[str]]]" = None,
        key: "Optional[Union[str, os.PathLike[str]]]" = None,
        *,
        server_name: Optional[str] = None,
    ) -> None:
        if (cert is None) != (key is None):
            raise InvalidArgument("TLS: cert and key go together (the client certificate and its private key)")
        self.ca: Optional[str] = os.fspath(ca)
        self.cert: Optional[str] = None if cert is None else os.fspath(cert)
        self.key: Optional[str] = None if key is None else os.fspath(key)
        self.server_name = _check_name(server_name)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, checks the name
        ctx.minimum_version = _TLS12
        try:
            ctx.load_verify_locations(cafile=self.ca)
        except (OSError, ssl.SSLError, ValueError) as e:
            raise InvalidArgument(f"TLS: cannot read CA certificates from {self.ca}: {e}") from None
        if not ctx.get_ca_certs():
            raise InvalidArgument(f"TLS: {self.ca} holds no PEM CA certificate")
        if self.cert is not None:
            try:
                # No password: OpenSSL would otherwise ask on the terminal.
                ctx.load_cert_chain(self.cert, self.key, password=_no_password)
            except _EncryptedKey:
                raise InvalidArgument(f"TLS: the private key {self.key} is encrypted: give an unencrypted key (mode 600)") from None
            except (OSError, ssl.SSLError, ValueError) as e:
                raise InvalidArgument(f"TLS: {self.cert} and {self.key} do not make a usable client certificate: {e}") from None
        self._context = ctx

    @classmethod
    def from_context(cls, context: ssl.SSLContext, *, server_name: Optional[str] = None) -> "TlsConfig":
        """An ``ssl.SSLContext`` made by the application (for example with
        ``ssl.create_default_context()``, to trust the system's CAs). It must
        verify the server's certificate (``CERT_REQUIRED``) and check its name
        (``check_hostname``), and allow nothing older than TLS 1.2; it is not
        changed."""
        if not isinstance(context, ssl.SSLContext):
            raise InvalidArgument(f"TLS: expected an ssl.SSLContext, not {type(context).__name__}")
        if context.verify_mode != ssl.CERT_REQUIRED or not context.check_hostname:
            raise InvalidArgument("TLS: the SSLContext must verify the server's certificate and name (verify_mode CERT_REQUIRED, check_hostname True)")
        if context.minimum_version not in (_TLS12, _TLS13):
            raise InvalidArgument("TLS: the SSLContext must refuse versions older than TLS 1.2 (set minimum_version = ssl.TLSVersion.TLSv1_2)")
        self = cls.__new__(cls)
        self._context = context
        self.server_name = _check_name(server_name)
        self.ca = self.cert = self.key = None
        return self

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "Optional[TlsConfig]":
        """TLS as the ``ringlock`` CLI configures it: ``RINGLOCK_TLS_CA``
        (turns TLS on), ``RINGLOCK_TLS_CERT`` and ``RINGLOCK_TLS_KEY``,
        ``RINGLOCK_TLS_SERVER_NAME`` (unset or empty: none). None (plain text)
        when none is set; InvalidArgument when one is set without the CA."""
        env = os.environ if environ is None else environ

        def get(name: str) -> Optional[str]:
            value = env.get(name)
            return value if value else None

        ca, cert, key, name = get(ENV_CA), get(ENV_CERT), get(ENV_KEY), get(ENV_SERVER_NAME)
        if ca is None:
            if cert is not None or key is not None or name is not None:
                raise InvalidArgument(f"TLS needs ${ENV_CA}: the CA that signs the servers' certificates")
            return None
        if (cert is None) != (key is None):
            raise InvalidArgument(f"TLS: ${ENV_CERT} and ${ENV_KEY} go together")
        return cls(ca, cert, key, server_name=name)

    @property
    def context(self) -> ssl.SSLContext:
        return self._context

    def name_for(self, host: str) -> str:
        """The name the certificate of the node at ``host`` must carry."""
        return self.server_name if self.server_name is not None else host

    def __repr__(self) -> str:
        if self.ca is None:
            return f"TlsConfig.from_context(..., server_name={self.server_name!r})"
        return f"TlsConfig(ca={self.ca!r}, cert={self.cert!r}, key={self.key!r}, server_name={self.server_name!r})"


class _EncryptedKey(Exception):
    pass


def _no_password() -> str:
    raise _EncryptedKey()


def _check_name(name: Optional[str]) -> Optional[str]:
    if name is None:
        return None
    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        raise InvalidArgument(f"TLS: {name!r} is not a name a certificate can be checked against")
    return name


def tls_config(tls: "Union[TlsConfig, ssl.SSLContext, None]") -> Optional[TlsConfig]:
    """The ``tls=`` argument of the clients and probes."""
    if tls is None or isinstance(tls, TlsConfig):
        return tls
    if isinstance(tls, ssl.SSLContext):
        return TlsConfig.from_context(tls)
    raise InvalidArgument(f"tls must be a TlsConfig or an ssl.SSLContext, not {type(tls).__name__}")


# What OpenSSL's reasons mean, in the words of the Rust client and CLI.
_ALERTS = {
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "the server requires a client certificate (TlsConfig cert and key)",
    "TLSV1_ALERT_UNKNOWN_CA": "the server does not accept our client certificate (not signed by its client CA)",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the server does not accept our client certificate (not signed by its client CA)",
    "SSLV3_ALERT_HANDSHAKE_FAILURE": "the server refused the handshake (a client certificate required, or no common TLS version?)",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "the server refused our client certificate: it has expired",
    "WRONG_VERSION_NUMBER": "the server did not answer in TLS (a plain-text port?)",
    "UNKNOWN_PROTOCOL": "the server did not answer in TLS (a plain-text port?)",
    "RECORD_LAYER_FAILURE": "the server did not answer in TLS (a plain-text port?)",
    "PACKET_LENGTH_TOO_LONG": "the server did not answer in TLS (a plain-text port?)",
    "TLSV1_ALERT_PROTOCOL_VERSION": "the server and the client share no TLS version (TLS 1.2 or 1.3 needed)",
    "UNSUPPORTED_PROTOCOL": "the server and the client share no TLS version (TLS 1.2 or 1.3 needed)",
}

# X509_V_ERR_* codes (OpenSSL's x509_vfy.h).
_VERIFY = {
    2: "is not signed by the CA given (TlsConfig ca)",  # unable to get issuer certificate
    10: "has expired",
    9: "is not valid yet",
    18: "is not signed by the CA given (TlsConfig ca)",  # self-signed leaf
    19: "is not signed by the CA given (TlsConfig ca)",  # self-signed in chain
    20: "is not signed by the CA given (TlsConfig ca)",  # unable to get local issuer
    21: "is not signed by the CA given (TlsConfig ca)",  # unable to verify the first certificate
    62: "does not name the address dialed (see server_name)",  # hostname mismatch
    64: "does not name the address dialed (see server_name)",  # IP address mismatch
}


def explain(err: BaseException) -> Optional[str]:
    """Says what a TLS failure means, for error messages; None if ``err`` is
    not one."""
    if isinstance(err, ssl.SSLCertVerificationError):
        what = _VERIFY.get(err.verify_code, "was refused")
        return f"TLS: the server's certificate {what} ({err.verify_message})"
    if isinstance(err, ssl.SSLEOFError):
        return "TLS: the server closed the connection during the handshake (a plain-text port, or it refused us?)"
    if isinstance(err, ssl.SSLError):
        reason = getattr(err, "reason", None)
        if reason in _ALERTS:
            return f"TLS: {_ALERTS[reason]}"
        return f"TLS: {err}"
    return None
