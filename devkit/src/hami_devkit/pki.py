"""Certificates for the local control plane, made with the ``cryptography`` package.

One certificate authority signs everything: the API server's serving certificate, the admin
client certificate (group ``system:masters``) and any serving certificate a test needs for its
own HTTPS server (an admission webhook, an extender), so the cluster's CA bundle trusts it.
The CA key is RSA-2048, kubeadm's default: the API server checks the client certificate's
signature on every request, and an RSA signature verifies several times faster than an ECDSA
P-256 one (with a P-256 CA that check was about 15% of the API server's CPU under the
scheduler benchmark). Leaf keys are ECDSA P-256: fast to generate, accepted everywhere.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID_BEFORE = datetime.timedelta(hours=1)
_VALID_FOR = datetime.timedelta(days=365)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, both PEM-encoded."""

    cert_pem: bytes
    key_pem: bytes


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _new_ca_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(parts)


def _san(hosts: tuple[str, ...]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


class CertificateAuthority:
    """A self-signed CA that issues serving and client certificates."""

    def __init__(self, common_name: str = "hami-dev-ca") -> None:
        self._key = _new_ca_key()
        now = datetime.datetime.now(datetime.timezone.utc)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(_name(common_name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _VALID_BEFORE)
            .not_valid_after(now + _VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
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
            .sign(self._key, hashes.SHA256())
        )

    @property
    def pair(self) -> KeyPair:
        return KeyPair(self._cert.public_bytes(serialization.Encoding.PEM), _key_pem(self._key))

    def issue(
        self,
        common_name: str,
        *,
        hosts: tuple[str, ...] = (),
        organization: str | None = None,
        server: bool = True,
        client: bool = False,
    ) -> KeyPair:
        """A certificate for ``common_name``; ``hosts`` (IPs or DNS names) become its SANs."""
        key = _new_key()
        now = datetime.datetime.now(datetime.timezone.utc)
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
            [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organization))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _VALID_BEFORE)
            .not_valid_after(now + _VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if hosts:
            builder = builder.add_extension(_san(hosts), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def service_account_keys() -> KeyPair:
    """The service-account token signing key: ``cert_pem`` holds the public key (PEM)."""
    key = _new_key()
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return KeyPair(public, _key_pem(key))
