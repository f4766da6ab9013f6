"""amqps:// through a TLS-terminating proxy in front of the broker (CA and certs from trustme)."""

from __future__ import annotations

import anyio
import pytest
from harness import TLSMaterial, TLSTerminatingProxy
from harness.tls import CLIENT_COMMON_NAME

from ojs_anyio import amqp

pytestmark = pytest.mark.anyio


async def _round_trip(conn: amqp.Connection) -> None:
    async with conn.channel() as ch:
        info = await ch.queue_declare("", exclusive=True)
        await ch.publish(b"over tls", routing_key=info.name)
        async with ch.consume(info.name, prefetch=1) as messages:
            async for msg in messages:
                assert msg.body == b"over tls"
                await msg.ack()
                break


@pytest.mark.usefixtures("rabbitmq_url")
async def test_cacertfile_verifies_the_server(tls_material: TLSMaterial) -> None:
    async with TLSTerminatingProxy(tls_material) as proxy:
        url = proxy.url()
        assert url.startswith("amqps://") and "cacertfile=" in url and "verify=verify_peer" in url
        with anyio.fail_after(10):
            async with amqp.connect(url) as conn:
                assert conn.url.tls
                await _round_trip(conn)
        assert proxy.tls_handshake_failures == 0


async def test_default_verification_rejects_an_unknown_ca(tls_material: TLSMaterial) -> None:
    async with TLSTerminatingProxy(tls_material) as proxy:
        # No cacertfile: the system's CAs, which never signed the test CA's certificate.
        url = f"amqps://guest:guest@127.0.0.1:{proxy.port}/?server_name_indication=localhost"
        with anyio.fail_after(10), pytest.raises(amqp.ConnectionLostError) as info:
            async with amqp.connect(url):
                pass
    assert "TLS handshake" in str(info.value)
    assert "CERTIFICATE_VERIFY_FAILED" in str(info.value)


async def test_an_unrelated_ca_is_rejected(tls_material: TLSMaterial) -> None:
    async with TLSTerminatingProxy(tls_material) as proxy:
        url = proxy.url(cacertfile=tls_material.untrusted_ca_cert_path)
        with anyio.fail_after(10), pytest.raises(amqp.ConnectionLostError, match="CERTIFICATE_VERIFY_FAILED"):
            async with amqp.connect(url):
                pass


async def test_wrong_server_name_is_rejected(tls_material: TLSMaterial) -> None:
    async with TLSTerminatingProxy(tls_material) as proxy:
        url = proxy.url(server_name_indication="broker.example.com")
        with anyio.fail_after(10), pytest.raises(amqp.ConnectionLostError, match="TLS handshake"):
            async with amqp.connect(url):
                pass


@pytest.mark.usefixtures("rabbitmq_url")
async def test_verify_none_accepts_any_certificate(tls_material: TLSMaterial) -> None:
    async with TLSTerminatingProxy(tls_material) as proxy:
        url = f"amqps://guest:guest@127.0.0.1:{proxy.port}/?verify=verify_none"
        with anyio.fail_after(10):
            async with amqp.connect(url) as conn:
                await _round_trip(conn)


@pytest.mark.usefixtures("rabbitmq_url")
async def test_client_certificate(tls_material: TLSMaterial) -> None:
    async with TLSTerminatingProxy(tls_material, require_client_cert=True) as proxy:
        url = proxy.url(client_cert=True)
        assert "certfile=" in url and "keyfile=" in url
        with anyio.fail_after(10):
            async with amqp.connect(url) as conn:
                await _round_trip(conn)
        assert proxy.client_common_names == [CLIENT_COMMON_NAME]


async def test_missing_client_certificate_fails(tls_material: TLSMaterial) -> None:
    async with TLSTerminatingProxy(tls_material, require_client_cert=True) as proxy:
        url = proxy.url(client_cert=False)
        with anyio.fail_after(10), pytest.raises(amqp.ConnectionLostError):
            async with amqp.connect(url):
                pass
        assert proxy.tls_handshake_failures == 1


@pytest.mark.usefixtures("rabbitmq_url")
async def test_explicit_ssl_context(tls_material: TLSMaterial) -> None:
    async with TLSTerminatingProxy(tls_material, require_client_cert=True) as proxy:
        url = f"amqps://guest:guest@localhost:{proxy.port}/"
        ctx = tls_material.client_ssl_context(with_client_cert=True)
        with anyio.fail_after(10):
            async with amqp.connect(url, ssl_context=ctx) as conn:
                await _round_trip(conn)


@pytest.mark.usefixtures("rabbitmq_url")
async def test_tls_connection_survives_large_messages(tls_material: TLSMaterial) -> None:
    body = bytes(range(256)) * 4096 * 2  # 2 MiB: many frames, many TLS records
    async with TLSTerminatingProxy(tls_material) as proxy:
        with anyio.fail_after(20):
            async with amqp.connect(proxy.url()) as conn, conn.channel() as ch:
                info = await ch.queue_declare("", exclusive=True)
                await ch.publish(body, routing_key=info.name)
                msg = await ch.get(info.name, no_ack=True)
                assert msg is not None and msg.body == body
