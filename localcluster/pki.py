"""Certificates and keys for the local control plane: one CA, serving and client certs.

Generated once per cluster directory with ``cryptography``: the apiserver serving cert,
client certs for the admin, controller-manager, scheduler and node agent (the identity is
the certificate's CN and O, as Kubernetes' x509 authenticator reads them), and the
service-account signing key pair.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class ClientIdentity:
    """A client certificate subject: user name (CN) and groups (O)."""

    file_stem: str
    user: str
    groups: tuple[str, ...] = ()


CLIENTS = (
    ClientIdentity("admin", "localcluster-admin", ("system:masters",)),
    ClientIdentity("controller-manager", "system:kube-controller-manager"),
    ClientIdentity("scheduler", "system:kube-scheduler"),
    # The node agent registers and heartbeats many nodes from one process, so it cannot use
    # per-node system:node identities; it acts as an administrator.
    ClientIdentity("node-agent", "localcluster-node-agent", ("system:masters",)),
)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _builder(subject: x509.Name, issuer: x509.Name, public_key: object) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
    )


def generate(directory: Path) -> None:
    """Write ``ca.crt``, serving, client and service-account keys into ``directory``.

    Idempotent: an existing complete set is kept, so a reused cluster directory keeps
    its identities (and kubeconfigs written earlier stay valid).
    """
    directory.mkdir(parents=True, exist_ok=True)
    _front_proxy(directory)
    marker = directory / "sa.pub"
    if marker.exists():
        return
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localcluster-ca")])
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key())
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
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(directory / "ca.key", ca_key)
    _write_cert(directory / "ca.crt", ca_cert)

    serving_key = _key()
    sans: list[x509.GeneralName] = [
        x509.DNSName(name)
        for name in (
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        )
    ]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", "10.0.0.1")]
    serving = (
        _builder(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
            ca_name,
            serving_key.public_key(),
        )
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(directory / "apiserver.key", serving_key)
    _write_cert(directory / "apiserver.crt", serving)

    for client in CLIENTS:
        key = _key()
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, client.user)]
        attributes += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in client.groups]
        cert = (
            _builder(x509.Name(attributes), ca_name, key.public_key())
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        _write_key(directory / f"{client.file_stem}.key", key)
        _write_cert(directory / f"{client.file_stem}.crt", cert)

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(directory / "sa.key", sa_key)
    marker.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


FRONT_PROXY_CLIENT = "front-proxy-client"
"""The apiserver's identity towards aggregated APIs (``--requestheader-allowed-names``)."""


def _front_proxy(directory: Path) -> None:
    """The front proxy's own CA and the apiserver's client certificate under it, with
    which the apiserver proxies requests to aggregated APIs (Kueue's visibility API):
    they trust the user it names in its headers because the certificate is signed by the
    CA the apiserver publishes in ``kube-system/extension-apiserver-authentication``
    (``--requestheader-client-ca-file``), as kubeadm sets it up. Written once."""
    if (directory / "front-proxy-client.crt").exists():
        return
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localcluster-front-proxy-ca")])
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(directory / "front-proxy-ca.key", ca_key)
    _write_cert(directory / "front-proxy-ca.crt", ca_cert)
    key = _key()
    cert = (
        _builder(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, FRONT_PROXY_CLIENT)]),
            ca_name,
            key.public_key(),
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(directory / "front-proxy-client.key", key)
    _write_cert(directory / "front-proxy-client.crt", cert)
