"""Where the API may listen: plain HTTP on loopback only unless the operator insists, TLS
anywhere, and the remote client verifying the server's certificate."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import privsched as ps
import privsched.remote
from privsched.remote import RemoteError
from privsched.server.runner import Listen, http_api, parse_listen
from tests.server_fixtures import make_database


@given(st.sampled_from(["127.0.0.1", "localhost", "::1", "127.8.9.10"]), st.integers(0, 65535))
def test_a_loopback_address_needs_no_tls(host: str, port: int):
    text = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    assert parse_listen(text) == Listen(host, port)


@given(st.ip_addresses().filter(lambda a: not a.is_loopback), st.integers(0, 65535))
def test_any_other_address_needs_tls_or_an_explicit_insecure_flag(address, port: int):
    text = f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"
    with pytest.raises(ValueError, match="needs TLS"):
        parse_listen(text)
    assert parse_listen(text, insecure=True).host == str(address)


@given(st.text(max_size=20).filter(lambda t: not t.rpartition(":")[2].isdigit() or not t.rpartition(":")[0]))
def test_text_that_is_not_host_and_port_is_refused_with_one_line(text: str):
    with pytest.raises(ValueError, match="--listen must be HOST:PORT"):
        parse_listen(text)


def test_a_port_out_of_range_and_half_a_tls_pair_are_refused(tmp_path: Path):
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen("127.0.0.1:65536")
    with pytest.raises(ValueError, match="go together"):
        parse_listen("0.0.0.0:8470", tls_cert=str(tmp_path / "c.pem"))
    with pytest.raises(ValueError, match="no TLS file"):
        parse_listen("0.0.0.0:8470", tls_cert=str(tmp_path / "c.pem"), tls_key=str(tmp_path / "k.pem"))


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key (PEM files)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "privsched test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert_path, key_path


def test_the_api_serves_over_tls_and_the_client_verifies_the_certificate(tmp_path: Path):
    db = tmp_path / "p.db"
    tokens = make_database(db)
    cert, key = self_signed(tmp_path)
    with http_api(db, parse_listen("127.0.0.1:0", str(cert), str(key))) as bound:
        assert bound.url.startswith("https://")
        trusted = ps.remote.RemoteClient(bound.url, tokens["admin"], cafile=str(cert))
        assert [d.name for d in trusted.datasets()] == ["reviews", "secret"]
        with pytest.raises(RemoteError, match="CERTIFICATE_VERIFY_FAILED"):
            ps.connect(bound.url, token=tokens["admin"]).datasets()
