"""TLS test material (trustme) and a TLS-terminating proxy in front of the plaintext broker.

``make_ca_and_cert()`` writes a throw-away CA, a server certificate for ``localhost`` and
``127.0.0.1``, a client certificate signed by the same CA, and an unrelated CA (for "verify
fails" tests) into a directory.  ``TLSTerminatingProxy`` accepts TLS on ``127.0.0.1`` port 0,
optionally demands a client certificate, and forwards the decrypted bytes to the broker.  It is
a ``FaultProxy``, so every fault control works on TLS connections too.
"""

from __future__ import annotations

import ipaddress
import ssl
import tempfile
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
import trustme
from anyio.abc import ByteStream, SocketStream
from anyio.streams.tls import TLSAttribute, TLSStream
from support.brokers import RABBITMQ_HOST, RABBITMQ_PORT

from .proxy import FaultProxy, _Connection, build_amqp_url

__all__ = ["TLSMaterial", "TLSTerminatingProxy", "make_ca_and_cert"]

CLIENT_COMMON_NAME = "ojs-test-client"


@dataclass(frozen=True, slots=True, kw_only=True)
class TLSMaterial:
    """Paths of the PEM files written by ``make_ca_and_cert()`` (and the CA that signed them)."""

    directory: Path
    hostname: str
    ca: trustme.CA
    ca_cert_path: Path
    server_cert_path: Path
    server_key_path: Path
    client_cert_path: Path
    client_key_path: Path
    client_common_name: str
    #: A CA that signed nothing here: a client trusting only it must fail to verify the server.
    untrusted_ca_cert_path: Path

    def server_ssl_context(self, *, require_client_cert: bool = False) -> ssl.SSLContext:
        """Server-side context with the server certificate; optionally demands a client cert."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.server_cert_path, self.server_key_path)
        if require_client_cert:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=self.ca_cert_path)
        return context

    def client_ssl_context(self, *, with_client_cert: bool = True, trust_ca: bool = True) -> ssl.SSLContext:
        """Client-side context verifying the server against the CA (or the untrusted one)."""
        cafile = self.ca_cert_path if trust_ca else self.untrusted_ca_cert_path
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(cafile))
        if with_client_cert:
            context.load_cert_chain(self.client_cert_path, self.client_key_path)
        return context


def make_ca_and_cert(hostname: str = "localhost", directory: Path | None = None) -> TLSMaterial:
    """Create a CA, a server cert for ``hostname`` (and 127.0.0.1) and a client cert, as files.

    Without ``directory`` the files go to a fresh ``tempfile.mkdtemp()`` directory, which the
    caller owns (prefer passing pytest's ``tmp_path``).
    """
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix="ojs-tls-"))
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="ojs-anyio test CA")
    identities = [hostname]
    if not _is_ip(hostname):
        identities.append("127.0.0.1")
    server = ca.issue_cert(*identities, common_name=hostname)
    client = ca.issue_cert(CLIENT_COMMON_NAME, common_name=CLIENT_COMMON_NAME)
    untrusted = trustme.CA(organization_name="ojs-anyio untrusted CA")

    material = TLSMaterial(
        directory=directory,
        hostname=hostname,
        ca=ca,
        ca_cert_path=directory / "ca.pem",
        server_cert_path=directory / "server.pem",
        server_key_path=directory / "server.key",
        client_cert_path=directory / "client.pem",
        client_key_path=directory / "client.key",
        client_common_name=CLIENT_COMMON_NAME,
        untrusted_ca_cert_path=directory / "untrusted-ca.pem",
    )
    ca.cert_pem.write_to_path(str(material.ca_cert_path))
    untrusted.cert_pem.write_to_path(str(material.untrusted_ca_cert_path))
    for cert, cert_path, key_path in (
        (server, material.server_cert_path, material.server_key_path),
        (client, material.client_cert_path, material.client_key_path),
    ):
        cert_path.write_bytes(b"".join(pem.bytes() for pem in cert.cert_chain_pems))
        key_path.touch(mode=0o600)
        cert.private_key_pem.write_to_path(str(key_path))
    return material


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class TLSTerminatingProxy(FaultProxy):
    """``async with TLSTerminatingProxy(material) as tls:`` TLS on 127.0.0.1 -> plaintext target.

    :param require_client_cert: demand a client certificate signed by the material's CA; a
        client without one fails the handshake (with TLS 1.3 the client may only notice on its
        first read) and the connection is counted in ``tls_handshake_failures``
    :param handshake_timeout: bound on the TLS handshake (``connect_timeout`` is also applied)
    """

    scheme = "amqps"

    def __init__(
        self,
        material: TLSMaterial,
        target_host: str = RABBITMQ_HOST,
        target_port: int = RABBITMQ_PORT,
        *,
        require_client_cert: bool = False,
        handshake_timeout: float = 10.0,
        connect_timeout: float = 10.0,
        chunk_size: int = 65536,
        max_buffered_chunks: int = 64,
    ) -> None:
        super().__init__(
            target_host,
            target_port,
            connect_timeout=connect_timeout,
            chunk_size=chunk_size,
            max_buffered_chunks=max_buffered_chunks,
        )
        self.material = material
        self.require_client_cert = require_client_cert
        self.handshake_timeout = handshake_timeout
        self._ssl_context = material.server_ssl_context(require_client_cert=require_client_cert)
        self._tls_handshake_failures = 0
        self._client_common_names: deque[str | None] = deque(maxlen=100)

    @property
    def tls_handshake_failures(self) -> int:
        return self._tls_handshake_failures

    @property
    def client_common_names(self) -> list[str | None]:
        """Common names of client certificates seen, oldest first (last 100; None: no cert)."""
        return list(self._client_common_names)

    def url(
        self,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        *,
        client_cert: bool | None = None,
        verify: Literal["verify_peer", "verify_none"] = "verify_peer",
        server_name_indication: str | None = None,
        **query: object,
    ) -> str:
        """``amqps://user:password@127.0.0.1:{port}/{vhost}?cacertfile=...&verify=...&...``.

        ``client_cert`` (default: ``require_client_cert``) adds ``certfile`` and ``keyfile``;
        ``server_name_indication`` defaults to the certificate's host name.  Extra ``query``
        items are appended and override these; None values are left out.
        """
        if client_cert is None:
            client_cert = self.require_client_cert
        params: dict[str, object] = {"cacertfile": self.material.ca_cert_path}
        if client_cert:
            params["certfile"] = self.material.client_cert_path
            params["keyfile"] = self.material.client_key_path
        params["verify"] = verify
        params["server_name_indication"] = server_name_indication or self.material.hostname
        params.update(query)
        return build_amqp_url(
            self.scheme, self.host, self.port, user=user, password=password, vhost=vhost, query=params
        )

    async def _wrap_client(self, stream: SocketStream, conn: _Connection) -> ByteStream:
        with anyio.fail_after(self.handshake_timeout):
            tls_stream = await TLSStream.wrap(
                stream, server_side=True, ssl_context=self._ssl_context, standard_compatible=True
            )
        peer: dict[str, Any] | None = tls_stream.extra(TLSAttribute.peer_certificate, None)
        self._client_common_names.append(_common_name(peer))
        return tls_stream

    def _count_failure(self, stage: Literal["client", "target"]) -> None:
        super()._count_failure(stage)
        if stage == "client":
            self._tls_handshake_failures += 1


def _common_name(peer_certificate: dict[str, Any] | None) -> str | None:
    if not peer_certificate:
        return None
    for rdn in peer_certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
