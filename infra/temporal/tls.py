"""Secured connections to Temporal: the TLS settings and API key a client presents, and refusals said in words.

`client_credentials` reads what `temporal.tls`, `temporal.api_key_env` and `api_key_file` name when a process
connects (a file that cannot be read, or an unset variable, is a `TemporalSecurityError` naming the field), and
checks the files up front (`check_tls_files`: the CA parses, the key is the certificate's, the certificate is
valid now and may authenticate a client); `handshake_problem` then shakes hands with the server once with Python's
TLS, so a server
certificate this client refuses, or a client certificate the server refuses, is said from the handshake's own
verdict before the SDK dials. What only the SDK sees stays for `security_problem`: it
turns what the SDK's core reports about a failed handshake or a refused credential (a rustls or tonic error
text, or the server's UNAUTHENTICATED / PERMISSION_DENIED) into a sentence that says what is wrong and which
setting fixes it; `certificate_verdict` asks the server again when the core saw only a closed connection. Such
failures are not outages: waiting does not change a certificate.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import re
import socket
import ssl
from pathlib import Path

from temporalio.service import RPCError, RPCStatusCode, TLSConfig

from rollart.spec.config import TemporalConfig
from rollart.spec.config.temporal import TemporalTLS

__all__ = [
    "TemporalSecurityError",
    "api_key_from_file",
    "certificate_verdict",
    "check_tls_files",
    "client_credentials",
    "closed_connection_hint",
    "handshake_problem",
    "is_tls_failure",
    "security_problem",
]


class TemporalSecurityError(ConnectionError):
    """TLS or credentials stand between this client and the server (an unreadable certificate file, an unset API
    key variable, a certificate either side refused, a key the server rejected): waiting will not help."""


def client_credentials(temporal: TemporalConfig) -> tuple[TLSConfig | None, str | None]:
    """The `tls` and `api_key` arguments of `Client.connect` for these settings, read now.

    No `tls` section gives None, which the SDK takes as plain gRPC, or as TLS with the trusted roots when an API
    key is given.
    """
    tls = None
    if temporal.tls is not None:
        t = temporal.tls
        check_tls_files(t)
        tls = TLSConfig(
            server_root_ca_cert=_pem(t.ca, "ca"),
            client_cert=_pem(t.cert, "cert"),
            client_private_key=_pem(t.key, "key"),
            domain=t.server_name,
        )
    return tls, _api_key(temporal.api_key_env) or api_key_from_file(temporal)


def check_tls_files(tls: TemporalTLS) -> None:
    """Fail now, naming the field, on TLS files that cannot work: a CA file with no certificate, a key that is not
    the certificate's, a certificate expired or not valid yet, or one whose extended key usage leaves out client
    authentication (the server would refuse it mid-handshake, where the SDK can only say the connection closed)."""
    for field in ("ca", "cert", "key"):
        _pem(getattr(tls, field), field)  # readable and PEM, each named on its own
    if tls.ca is not None:
        try:
            ssl.create_default_context(cafile=str(tls.ca.expanduser()))
        except ssl.SSLError as e:
            raise TemporalSecurityError(f"temporal.tls.ca: {tls.ca} holds no usable CA certificate: {e}") from e
    if tls.cert is None or tls.key is None:
        return
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(tls.cert.expanduser(), tls.key.expanduser())
    except ssl.SSLError as e:
        if "KEY_VALUES_MISMATCH" in (e.reason or "") or "key values mismatch" in str(e):
            raise TemporalSecurityError(
                f"temporal.tls.key: {tls.key} is not the private key of temporal.tls.cert {tls.cert}: give the "
                "key the certificate was issued for"
            ) from e
        raise TemporalSecurityError(
            f"temporal.tls.cert/key: {tls.cert} and {tls.key} do not load as a certificate and its key: {e}"
        ) from e
    if problem := _client_cert_problem(tls.cert.expanduser().read_bytes()):
        raise TemporalSecurityError(f"temporal.tls.cert: {tls.cert} {problem}")


def _client_cert_problem(pem: bytes) -> str | None:
    """What makes the (first) certificate in `pem` unfit to authenticate a client now; None when nothing does, or
    when `cryptography` (which reads it) is not installed."""
    try:
        from cryptography import x509
        from cryptography.x509.oid import ExtendedKeyUsageOID
    except ImportError:
        return None
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError as e:
        return f"is not a certificate: {e}"
    now = datetime.datetime.now(datetime.UTC)
    if cert.not_valid_after_utc < now:
        return f"expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: renew it"
    if cert.not_valid_before_utc > now:
        return f"is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC (are the clocks right?)"
    try:
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return None
    if ExtendedKeyUsageOID.CLIENT_AUTH not in usage:
        return "does not allow client authentication (its extended key usage lacks clientAuth): a server refuses it"
    return None


async def handshake_problem(address: str, temporal: TemporalConfig, timeout_s: float = 3.0) -> str | None:
    """Shake hands with the server at `address` as the SDK will (the CA, the server name, the client certificate)
    and say what stands in the way, from the handshake's own verdict; None when it passes, or when nothing answers
    (an outage is for the caller's waiting to handle)."""
    return await asyncio.to_thread(_probe, address, temporal, timeout_s)


def _probe(address: str, temporal: TemporalConfig, timeout_s: float) -> str | None:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    tls = temporal.tls
    ctx = ssl.create_default_context(cafile=str(tls.ca.expanduser()) if tls is not None and tls.ca else None)
    ctx.set_alpn_protocols(["h2"])
    name = tls.server_name if tls is not None and tls.server_name else host
    if tls is not None and tls.cert is not None and tls.key is not None:
        ctx.load_cert_chain(tls.cert.expanduser(), tls.key.expanduser())
    try:
        raw = socket.create_connection((host, int(port)), timeout=timeout_s)
    except (OSError, ValueError):
        return None
    with raw:
        try:
            with ctx.wrap_socket(raw, server_hostname=name) as conn:
                conn.settimeout(0.3)
                try:  # TLS 1.3: the server's verdict on our certificate comes after the handshake completes
                    conn.recv(1)
                except TimeoutError:
                    pass
        except ssl.SSLCertVerificationError as e:
            return _server_cert_refused(e, address, temporal, name)
        except ssl.SSLError as e:
            reason = e.reason or ""
            if "ALERT" in reason:
                return _alert(_OPENSSL_ALERTS.get(reason, reason), address, temporal)
            if reason in ("WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE"):
                return (
                    f"the Temporal server at {address} did not answer the TLS handshake in TLS: it serves plain "
                    f"gRPC there, while {_why_tls(temporal)} turns TLS on: check the address, or connect without TLS"
                )
            return None
        except OSError:
            return None
    return None


def _server_cert_refused(e: ssl.SSLCertVerificationError, address: str, temporal: TemporalConfig, name: str) -> str:
    """This client refused the server's certificate: OpenSSL's verdict, in the words `_server_cert` uses."""
    message = e.verify_message or str(e)
    if e.verify_code in (2, 18, 19, 20, 21):  # issuer unknown, self-signed, local issuer not found, ...
        return _server_cert("UnknownIssuer", message, address, temporal)
    if e.verify_code == 10:
        return _server_cert("Expired", message, address, temporal)
    if e.verify_code == 9:
        return _server_cert("NotValidYet", message, address, temporal)
    if e.verify_code == 62 or "mismatch" in message.lower():
        carried = ", ".join(_names_carried(address, temporal)) or "other names"
        return (
            f"the Temporal server at {address} presented a certificate for {carried}, not for {name}: set "
            "temporal.tls.server_name to a name it carries, or dial it by one"
        )
    return f"the Temporal server at {address} presented a certificate this client refused: {message}"


def _names_carried(address: str, temporal: TemporalConfig, timeout_s: float = 2.0) -> list[str]:
    """The DNS names and IP addresses the server's certificate carries (a second handshake, names unchecked)."""
    host, _, port = address.rpartition(":")
    tls = temporal.tls
    ctx = ssl.create_default_context(cafile=str(tls.ca.expanduser()) if tls is not None and tls.ca else None)
    ctx.check_hostname = False
    try:
        if tls is not None and tls.cert is not None and tls.key is not None:
            ctx.load_cert_chain(tls.cert.expanduser(), tls.key.expanduser())  # an mTLS server wants it to answer
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as raw:
            with ctx.wrap_socket(raw) as conn:
                cert = conn.getpeercert() or {}
    except (OSError, ValueError):
        return []
    return [value.strip() for _, value in cert.get("subjectAltName", ())]


def _pem(path: Path | None, field: str) -> bytes | None:
    if path is None:
        return None
    try:
        data = path.expanduser().read_bytes()
    except OSError as e:
        raise TemporalSecurityError(f"temporal.tls.{field}: cannot read {path}: {e.strerror or e}") from e
    if b"-----BEGIN " not in data:
        raise TemporalSecurityError(f"temporal.tls.{field}: {path} is not a PEM file (no '-----BEGIN' line)")
    return data


def api_key_from_file(temporal: TemporalConfig) -> str | None:
    """The API key in `temporal.api_key_file` (a mounted Secret on Kubernetes), read at each connect: a rotated
    Secret is picked up by the next connection. None without the setting."""
    path = temporal.api_key_file
    if path is None:
        return None
    try:
        key = path.expanduser().read_text().strip()
    except OSError as e:
        raise TemporalSecurityError(f"temporal.api_key_file: cannot read {path}: {e.strerror or e}") from e
    if not key:
        raise TemporalSecurityError(f"temporal.api_key_file: {path} is empty; write the API key in it")
    return key


def _api_key(name: str | None) -> str | None:
    if name is None:
        return None
    key = os.environ.get(name, "").strip()
    if not key:
        state = "empty" if name in os.environ else "not set"
        raise TemporalSecurityError(
            f"temporal.api_key_env: the environment variable {name} is {state} in this "
            f"process: export {name}=<the API key>, or remove api_key_env"
        )
    return key


_ALERT = re.compile(r"received fatal alert: (\w+)|AlertReceived\((\w+)\)")
_BAD_SERVER_CERT = re.compile(r"InvalidCertificate\((\w+)")
_NAMES = re.compile(r'(?:DnsName|IpAddress)\(\\*"?([^"\\)]+)')
_STATUS = re.compile(r"code: (Unauthenticated|PermissionDenied), message: \"((?:[^\"\\]|\\.)*)\"")
_NOT_TLS = ("InvalidContentType", "InvalidMessage(", "CorruptMessage")
_CLOSED = (
    "close_notify",
    "connection closed",
    "broken pipe",
    "Broken pipe",
    "BrokenPipe",
    "ConnectionReset",
    "connection reset",
)

# what a TLS alert from the server says about the client certificate it was shown
_ALERT_MEANS = {
    "UnknownCA": "it is not signed by a CA the server trusts",
    "UnsupportedCertificate": "the server does not take it as a client certificate (does it carry the clientAuth "
    "extended key usage?)",
    "CertificateExpired": "it has expired",
    "CertificateRevoked": "it has been revoked",
    "AccessDenied": "the server does not admit this client",
}


def is_tls_failure(text: str) -> bool:
    """Whether an error text is a TLS handshake that failed (an alert, a certificate refused, not TLS at all)."""
    return bool(_ALERT.search(text) or _BAD_SERVER_CERT.search(text)) or any(m in text for m in _NOT_TLS)


def security_problem(error: BaseException, address: str, temporal: TemporalConfig) -> str | None:
    """What `error` (from connecting to or calling the server at `address`) says is wrong with TLS or the
    credentials, in words naming the settings that fix it; None when it is something else (e.g. an outage)."""
    if isinstance(error, RPCError):
        if error.status is RPCStatusCode.UNAUTHENTICATED:
            return _refused_credentials(address, temporal, error.message, "Unauthenticated")
        if error.status is RPCStatusCode.PERMISSION_DENIED:
            return _refused_credentials(address, temporal, error.message, "PermissionDenied")
    text = str(error)
    if m := _STATUS.search(text):
        return _refused_credentials(address, temporal, m.group(2), m.group(1))
    if m := _ALERT.search(text):
        return _alert(m.group(1) or m.group(2), address, temporal)
    if m := _BAD_SERVER_CERT.search(text):
        return _server_cert(m.group(1), text, address, temporal)
    if any(marker in text for marker in _NOT_TLS):
        return (
            f"the Temporal server at {address} did not answer the TLS handshake in TLS: it serves plain gRPC there, "
            f"while {_why_tls(temporal)} turns TLS on: check the address, or connect without TLS"
        )
    return None


async def certificate_verdict(address: str, temporal: TemporalConfig, timeout_s: float = 2.0) -> str | None:
    """Why the server refuses this client's certificate (or its lack of one), in words; None when it does not.

    The SDK's client cannot always tell: a TLS 1.3 client sends its first request with its last handshake
    message, and when the server answers that with an alert and closes, the request often fails as a closed
    connection, the alert unread. So shake hands once more with Python's own TLS and only listen: a server that
    refuses the certificate says so with its alert; one that accepts it waits for the request (or sends its
    HTTP/2 settings). The server's own certificate is not checked here: the SDK already did.
    """
    return await asyncio.to_thread(_listen_for_alert, address, temporal, timeout_s)


# OpenSSL's names for the alerts a server sends about a client certificate, as rustls names them
_OPENSSL_ALERTS = {
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "CertificateRequired",
    "TLSV1_ALERT_UNKNOWN_CA": "UnknownCA",
    "SSLV3_ALERT_BAD_CERTIFICATE": "BadCertificate",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE": "UnsupportedCertificate",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "CertificateExpired",
    "SSLV3_ALERT_CERTIFICATE_REVOKED": "CertificateRevoked",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "CertificateUnknown",
    "TLSV1_ALERT_ACCESS_DENIED": "AccessDenied",
    "SSLV3_ALERT_HANDSHAKE_FAILURE": "HandshakeFailure",
    "TLSV1_ALERT_DECRYPT_ERROR": "DecryptError",
}


def _listen_for_alert(address: str, temporal: TemporalConfig, timeout_s: float) -> str | None:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    tls = temporal.tls
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # only the server's verdict on this client matters here
    ctx.set_alpn_protocols(["h2"])
    try:
        if tls is not None and tls.cert is not None and tls.key is not None:
            ctx.load_cert_chain(tls.cert.expanduser(), tls.key.expanduser())
        with socket.create_connection((host, int(port)), timeout=timeout_s) as raw:
            name = tls.server_name if tls is not None and tls.server_name else host
            with ctx.wrap_socket(raw, server_hostname=name) as conn:
                conn.recv(1)
    except ssl.SSLError as e:
        reason = e.reason or ""
        if "ALERT" in reason:
            return _alert(_OPENSSL_ALERTS.get(reason, reason), address, temporal)
        return None
    except (OSError, ValueError):  # no answer in time (it waits for the request), or no connection at all
        return None
    return None


def closed_connection_hint(text: str, temporal: TemporalConfig) -> str:
    """A hint for a server that closed the connection right after it was opened, which is what a server does to a
    plain client when it requires TLS, or to a client whose certificate it refuses (or a server going down)."""
    if "after connection" not in text or not any(c in text for c in _CLOSED):
        return ""
    if not temporal.secured:
        return " (a server that requires TLS closes plain connections like this: if it does, set temporal.tls)"
    return (
        " (a server that refuses a client's certificate may close the connection like this: check "
        "temporal.tls.cert and temporal.tls.key)"
    )


def _why_tls(temporal: TemporalConfig) -> str:
    if temporal.tls is not None:
        return "temporal.tls"
    if temporal.api_key_file is not None:
        return f"temporal.api_key_file ({temporal.api_key_file})"
    return f"temporal.api_key_env ({temporal.api_key_env})"


def _alert(alert: str, address: str, temporal: TemporalConfig) -> str:
    """The server ended the handshake with `alert`: almost always about the client certificate."""
    cert = temporal.tls.cert if temporal.tls is not None else None
    if cert is None:
        if alert in ("CertificateRequired", "BadCertificate", "CertificateUnknown", "HandshakeFailure"):
            return (
                f"the Temporal server at {address} requires a client certificate (TLS alert {alert}): set "
                "temporal.tls.cert and temporal.tls.key (--temporal-tls-cert, --temporal-tls-key)"
            )
        return f"the TLS handshake with the Temporal server at {address} failed: the server sent alert {alert}"
    means = _ALERT_MEANS.get(alert)
    return (
        f"the Temporal server at {address} refused this client's certificate (temporal.tls.cert {cert}): TLS "
        f"alert {alert}" + (f"; {means}" if means else "")
    )


def _server_cert(reason: str, text: str, address: str, temporal: TemporalConfig) -> str:
    """This client refused the server's certificate for `reason` (a rustls CertificateError variant)."""
    ca = temporal.tls.ca if temporal.tls is not None else None
    if reason == "UnknownIssuer":
        if ca is None:
            return (
                f"the Temporal server at {address} presented a certificate no CA this machine trusts has signed: "
                "set temporal.tls.ca (--temporal-tls-ca) to the PEM file of the CA that signed it"
            )
        return (
            f"the Temporal server at {address} presented a certificate not signed by the CA in temporal.tls.ca "
            f"({ca}): point it at the CA that signed the server's certificate"
        )
    if reason.startswith("NotValidForName"):
        names = _NAMES.findall(text)
        wanted, carried = (names[0], names[1:]) if names else ("?", [])
        return (
            f"the Temporal server at {address} presented a certificate for {', '.join(carried) or 'other names'}, "
            f"not for {wanted}: set temporal.tls.server_name to a name it carries, or dial it by one"
        )
    if reason == "Expired":
        return f"the Temporal server at {address} presented an expired certificate"
    if reason == "NotValidYet":
        return f"the Temporal server at {address} presented a certificate not valid yet (are the clocks right?)"
    return f"the Temporal server at {address} presented a certificate this client refused: {reason}"


def _refused_credentials(address: str, temporal: TemporalConfig, message: str, code: str) -> str:
    shown = []
    if temporal.api_key_env:
        shown.append(f"the API key in ${temporal.api_key_env}")
    if temporal.api_key_file is not None:
        shown.append(f"the API key in {temporal.api_key_file}")
    if temporal.tls is not None and temporal.tls.cert is not None:
        shown.append(f"the client certificate {temporal.tls.cert}")
    credentials = " and ".join(shown) or "a client without credentials"
    no_key = (
        ""
        if temporal.has_api_key
        else " (no API key was sent: temporal.api_key_env names the variable holding one, api_key_file its file)"
    )
    if code == "PermissionDenied":
        return (
            f"the Temporal server at {address} denied this client access to namespace {temporal.namespace!r} "
            f"({message or code}); it was shown {credentials}{no_key}"
        )
    return f"the Temporal server at {address} did not accept {credentials}: {message or code}{no_key}"
