"""Certificates and a TLS front for tests of secured Temporal connections.

`make_pki` writes a CA, a server certificate for 127.0.0.1/localhost and a client certificate signed by it,
and a second CA that signed nothing here (the wrong one), with `cryptography` when it is installed, else
the `openssl` CLI. `TLSFront` terminates TLS (optionally requiring a client certificate, as a server set up
for mTLS does) and relays the bytes to a plain Temporal server behind it: gRPC is HTTP/2 over TLS, so a
byte relay after the handshake is a TLS Temporal frontend. `FakeFrontend` is a gRPC server over mTLS that answers
the two calls a client makes on connecting, and records the metadata they carried (an API key is inside TLS, where
a relay cannot read it without decoding HTTP/2).
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import selectors
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FakeFrontend", "Pki", "TLSFront", "make_pki"]


@dataclass(frozen=True)
class Pki:
    """PEM files: `ca` signed the server's and the client's certificates; `other_ca` signed only the stranger's
    (a client certificate the server does not trust)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    stranger_cert: Path
    stranger_key: Path


def make_pki(directory: Path) -> Pki:
    """A CA, a server certificate (127.0.0.1, localhost), a client certificate, and another CA with a client
    certificate of its own, in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return _openssl_pki(directory)
    return _cryptography_pki(directory)


def _cryptography_pki(d: Path) -> Pki:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )

    def issue(
        cn: str,
        key: ec.EllipticCurvePrivateKey,
        issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
        *,
        ca: bool = False,
        server: bool = False,
        client: bool = False,
    ) -> x509.Certificate:
        issuer_name, issuer_key = issuer or (name(cn), key)
        b = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(issuer_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if ca:
            b = b.add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            b = b.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        else:
            usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
                [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
            )
            b = b.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            b = b.add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False
            )
        if server:
            b = b.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        return b.sign(issuer_key, hashes.SHA256())

    def pem(cert: x509.Certificate, path: Path) -> Path:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    ca_key, other_key, server_key, client_key, stranger_key = (
        ec.generate_private_key(ec.SECP256R1()) for _ in range(5)
    )
    ca = issue("rollart test CA", ca_key, None, ca=True)
    other = issue("other test CA", other_key, None, ca=True)
    pem(ca, d / "ca.pem")
    pem(other, d / "other-ca.pem")
    pem(issue("localhost", server_key, (ca.subject, ca_key), server=True), d / "server.pem")
    pem(issue("rollart worker", client_key, (ca.subject, ca_key), client=True), d / "client.pem")
    pem(issue("stranger", stranger_key, (other.subject, other_key), client=True), d / "stranger.pem")
    for key, name in ((server_key, "server"), (client_key, "client"), (stranger_key, "stranger")):
        write_key(key, d / f"{name}.key")
    return _files(d)


def _openssl_pki(d: Path) -> Pki:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    for ca in ("ca", "other-ca"):
        run(
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            f"/CN={ca}",
            "-keyout",
            f"{ca}.key",
            "-out",
            f"{ca}.pem",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        )
    for who, ext, ca in (
        ("server", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth", "ca"),
        ("client", "extendedKeyUsage=clientAuth", "ca"),
        ("stranger", "extendedKeyUsage=clientAuth", "other-ca"),
    ):
        (d / f"{who}.ext").write_text(ext + "\nbasicConstraints=CA:FALSE\n")
        run(
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            f"/CN={who}",
            "-keyout",
            f"{who}.key",
            "-out",
            f"{who}.csr",
        )
        run(
            "x509",
            "-req",
            "-in",
            f"{who}.csr",
            "-CA",
            f"{ca}.pem",
            "-CAkey",
            f"{ca}.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            f"{who}.ext",
            "-out",
            f"{who}.pem",
        )
    return _files(d)


def _files(d: Path) -> Pki:
    return Pki(
        ca=d / "ca.pem",
        server_cert=d / "server.pem",
        server_key=d / "server.key",
        client_cert=d / "client.pem",
        client_key=d / "client.key",
        other_ca=d / "other-ca.pem",
        stranger_cert=d / "stranger.pem",
        stranger_key=d / "stranger.key",
    )


class TLSFront:
    """A TLS listener on 127.0.0.1 that relays each connection to `upstream` (a plain HOST:PORT) once the
    handshake is done; `require_client_cert` makes it refuse clients without a certificate signed by the CA.

    Threads with blocking sockets, so that a refused handshake ends with the TLS alert a real server sends
    (asyncio's TLS transport drops it and just closes). `refused` holds why each handshake failed.
    """

    def __init__(self, pki: Pki, upstream: str, require_client_cert: bool = True) -> None:
        self.pki = pki
        self.upstream = upstream
        self.require_client_cert = require_client_cert
        self.refused: list[str] = []
        self.relayed = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._ctx = self._context()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._listener.getsockname()[1]}"

    def _context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.pki.server_cert, self.pki.server_key)
        ctx.set_alpn_protocols(["h2"])
        if self.require_client_cert:
            ctx.load_verify_locations(self.pki.ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def __enter__(self) -> TLSFront:
        threading.Thread(target=self._accept, name="tls-front", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listener.close()
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        try:
            tls = self._ctx.wrap_socket(conn, server_side=True)  # sends the alert itself when it refuses
        except (ssl.SSLError, OSError) as e:
            self.refused.append(getattr(e, "reason", None) or str(e))
            _linger_close(conn)
            return
        host, port = self.upstream.rsplit(":", 1)
        try:
            up = socket.create_connection((host, int(port)), timeout=10)
        except OSError:
            tls.close()
            return
        with self._lock:
            self._open.update((tls, up))
        self.relayed += 1
        try:
            _relay(tls, up)
        finally:
            with self._lock:
                self._open.difference_update((tls, up))
            for s in (tls, up):
                with contextlib.suppress(OSError):
                    s.close()


def _linger_close(conn: socket.socket) -> None:
    """Close after the alert the way a careful server does: stop sending, read what the client had already sent,
    then close. Closing at once with unread data sends a reset, which can reach the client before it reads the
    alert (TLS 1.3 clients send their first request with their last handshake message): then it sees only a closed
    connection, as it may with a server that does just that."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(2)
        while conn.recv(65536):
            pass
    conn.close()


def _relay(tls: ssl.SSLSocket, up: socket.socket) -> None:
    """Bytes both ways until either side closes; one thread, so the TLS socket is never used from two at once."""
    tls.settimeout(None)
    up.settimeout(None)
    with selectors.DefaultSelector() as sel:
        sel.register(tls, selectors.EVENT_READ, up)
        sel.register(up, selectors.EVENT_READ, tls)
        while True:
            for key, _ in sel.select():
                src, dst = key.fileobj, key.data
                try:
                    data = src.recv(65536)
                    while isinstance(src, ssl.SSLSocket) and src.pending():
                        data += src.recv(src.pending())
                except (OSError, ssl.SSLError):
                    return
                if not data:
                    return
                try:
                    dst.sendall(data)
                except OSError:
                    return


class FakeFrontend:
    """Temporal's frontend as far goes, over mTLS: `GetSystemInfo` and `DescribeNamespace` answer,
    and each call's metadata is recorded in `seen`. With `api_key`, a call without `authorization: Bearer
    <api_key>` is refused with UNAUTHENTICATED, as a server checking API keys does."""

    def __init__(self, pki: Pki, api_key: str | None = None) -> None:
        self.pki = pki
        self.api_key = api_key
        self.seen: list[dict[str, str]] = []
        self._server: Any = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> FakeFrontend:
        from concurrent.futures import ThreadPoolExecutor

        import grpc
        from temporalio.api.workflowservice.v1 import (
            DescribeNamespaceRequest,
            DescribeNamespaceResponse,
            GetSystemInfoRequest,
            GetSystemInfoResponse,
        )

        def answer(response: Any) -> Any:
            def handle(request: Any, context: Any) -> Any:
                metadata = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
                self.seen.append(metadata)
                if self.api_key is not None and metadata.get("authorization") != f"Bearer {self.api_key}":
                    context.abort(grpc.StatusCode.UNAUTHENTICATED, "Request unauthorized.")
                return response()

            return handle

        calls = {
            "GetSystemInfo": grpc.unary_unary_rpc_method_handler(
                answer(GetSystemInfoResponse),
                request_deserializer=GetSystemInfoRequest.FromString,
                response_serializer=GetSystemInfoResponse.SerializeToString,
            ),
            "DescribeNamespace": grpc.unary_unary_rpc_method_handler(
                answer(DescribeNamespaceResponse),
                request_deserializer=DescribeNamespaceRequest.FromString,
                response_serializer=DescribeNamespaceResponse.SerializeToString,
            ),
        }
        self._server = grpc.server(ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("temporal.api.workflowservice.v1.WorkflowService", calls)]
        )
        credentials = grpc.ssl_server_credentials(
            [(self.pki.server_key.read_bytes(), self.pki.server_cert.read_bytes())],
            root_certificates=self.pki.ca.read_bytes(),
            require_client_auth=True,
        )
        self.port = self._server.add_secure_port("127.0.0.1:0", credentials)
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None)
