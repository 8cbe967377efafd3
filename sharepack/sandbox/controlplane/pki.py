"""A throwaway certificate authority for the sandbox's control plane.

The real kube-apiserver authenticates its callers as a cluster does: client certificates signed
by the cluster CA (the admin in `system:masters`, kube-scheduler as `system:kube-scheduler`, each
kubelet as `system:node:<name>` in `system:nodes`, so the Node authorizer and NodeRestriction
apply to it) and service-account tokens signed by a key of its own. Keys are EC P-256: quick to
make, accepted by every Go TLS stack involved.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True, slots=True)
class KeyPair:
    cert: Path
    key: Path

    def cert_pem(self) -> bytes:
        return self.cert.read_bytes()

    def key_pem(self) -> bytes:
        return self.key.read_bytes()


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    path.write_bytes(data)
    path.chmod(mode)


class Authority:
    """A CA in `directory` (ca.crt, ca.key) that issues server and client certificates there."""

    def __init__(self, directory: Path, name: str = "sharepack-sandbox-ca") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = _name(name)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                    key_encipherment=False, data_encipherment=False, key_agreement=False,
                    encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )  # fmt: skip
            .sign(self._key, hashes.SHA256())
        )
        self.ca = KeyPair(directory / "ca.crt", directory / "ca.key")
        _write(self.ca.cert, self._cert.public_bytes(serialization.Encoding.PEM), 0o644)
        _write(self.ca.key, _key_pem(self._key), 0o600)

    def issue(
        self,
        filename: str,
        common_name: str,
        *,
        organizations: tuple[str, ...] = (),
        hosts: tuple[str, ...] = (),
        client: bool = True,
        server: bool = False,
    ) -> KeyPair:
        """`filename`.crt/.key; `hosts` become DNS or IP subject alternative names."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usages = ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else []) + (
            [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organizations))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if hosts:
            names: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    names.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = KeyPair(self.directory / f"{filename}.crt", self.directory / f"{filename}.key")
        _write(pair.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
        _write(pair.key, _key_pem(key), 0o600)
        return pair


def signing_key(directory: Path, filename: str = "sa") -> KeyPair:
    """A key pair for signing service-account tokens (`.key` private, `.pub` public)."""
    key = ec.generate_private_key(ec.SECP256R1())
    pair = KeyPair(directory / f"{filename}.pub", directory / f"{filename}.key")
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    _write(pair.cert, public, 0o644)
    _write(pair.key, _key_pem(key), 0o600)
    return pair
