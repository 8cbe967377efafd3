"""Certificates for mutual TLS between the scheduler (driver or real kube-scheduler) and the
extender in the sandbox: a throwaway CA, the extender's serving certificate and a client
certificate for the scheduler, written as PEM files into one directory.

docs/install.md does the same with openssl for a real cluster. The serving certificate names
127.0.0.1 and localhost (the sandbox dials those) plus any names asked for; the client one
carries only the clientAuth usage, so it cannot serve, and the serving one cannot log in.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=7)  # a sandbox lives minutes; --keep-running a while longer
CLOCK_SKEW = datetime.timedelta(minutes=5)
SERVER_NAMES: tuple[str, ...] = ("localhost",)
SERVER_IPS: tuple[str, ...] = ("127.0.0.1", "::1")
CLIENT_NAME = "kube-scheduler"


@dataclass(frozen=True, slots=True)
class Issuer:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate


@dataclass(frozen=True, slots=True)
class TlsFiles:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def extender_args(self) -> list[str]:
        """The extender's flags that serve mutual TLS with these files."""
        return [
            f"--tls-cert-file={self.server_cert}",
            f"--tls-private-key-file={self.server_key}",
            f"--client-ca-file={self.ca_cert}",
        ]

    def client_context(self) -> ssl.SSLContext:
        """What a scheduler presents: the client certificate, trusting only this CA."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(self.ca_cert))
        ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        return ctx


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - CLOCK_SKEW).not_valid_after(now + VALIDITY)


def make_ca(common_name: str = "sharepack sandbox CA") -> Issuer:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    return Issuer(key, _validity(builder).sign(key, hashes.SHA256()))


def issue(
    ca: Issuer,
    common_name: str,
    *,
    server: bool,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
) -> Issuer:
    """A leaf certificate signed by `ca`: for serving (`server`, with the names as SANs) or for
    a TLS client."""
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
    )
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return Issuer(key, _validity(builder).sign(ca.key, hashes.SHA256()))


def _write_pair(directory: Path, stem: str, pair: Issuer) -> tuple[Path, Path]:
    cert, key = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert.write_bytes(pair.cert.public_bytes(serialization.Encoding.PEM))
    key.touch(mode=0o600)  # never readable by others, not even between creating and writing
    key.write_bytes(
        pair.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert, key


def write_tls_files(
    directory: Path,
    *,
    dns_names: Sequence[str] = SERVER_NAMES,
    ip_addresses: Sequence[str] = SERVER_IPS,
    ca_name: str = "sharepack sandbox CA",
) -> TlsFiles:
    """A fresh CA, a serving certificate for the extender and a client certificate for the
    scheduler, as PEM files in `directory` (ca.crt, server.crt/key, client.crt/key)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca(ca_name)
    ca_cert = directory / "ca.crt"
    ca_cert.write_bytes(ca.cert.public_bytes(serialization.Encoding.PEM))
    server = issue(ca, "sharepack-extender", server=True, dns_names=dns_names, ip_addresses=ip_addresses)
    server_cert, server_key = _write_pair(directory, "server", server)
    client_cert, client_key = _write_pair(directory, "client", issue(ca, CLIENT_NAME, server=False))
    return TlsFiles(ca_cert, server_cert, server_key, client_cert, client_key)
