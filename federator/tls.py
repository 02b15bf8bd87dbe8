"""TLS for a node's servers and for its calls to other nodes (``--tls-cert``, ``--tls-key``,
``--tls-ca``).

One certificate serves every port of a node (HTTP, Flight SQL, the key port). Nodes of one
application all run with TLS or all without: a node with TLS calls its peers over TLS and
checks their certificates against ``--tls-ca``, or, without it, against its own certificate
file (enough when every node shares one self-signed certificate, or when the file carries
the chain up to the CA). Peers are called by their advertised ``host:port``, so each
certificate must name that host (a DNS or IP subject alternative name).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Tls:
    cert: Path
    key: Path
    ca: Path | None = None
    server: ssl.SSLContext = field(init=False, repr=False, compare=False)
    client: ssl.SSLContext = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for path, flag in ((self.cert, "--tls-cert"), (self.key, "--tls-key"), (self.ca, "--tls-ca")):
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{flag} {str(path)!r} is not a readable file; give the PEM file's path")
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            server.load_cert_chain(self.cert, self.key)
        except (ssl.SSLError, OSError) as e:
            raise ValueError(f"--tls-cert {str(self.cert)!r} and --tls-key {str(self.key)!r} do not load as a PEM "
                             f"certificate and its private key ({e}); check that the key belongs to the certificate") from None
        try:
            client = ssl.create_default_context(cafile=str(self.ca or self.cert))
        except (ssl.SSLError, OSError) as e:
            flag = "--tls-ca" if self.ca else "--tls-cert (trusted for peers when no --tls-ca is given)"
            raise ValueError(f"{flag}: cannot load it as CA certificates ({e})") from None
        object.__setattr__(self, "server", server)
        object.__setattr__(self, "client", client)


def from_flags(cert: str | None, key: str | None, ca: str | None = None) -> Tls | None:
    """The node's TLS from its flags: None when neither --tls-cert nor --tls-key is given."""
    if not cert and not key:
        if ca:
            raise ValueError("--tls-ca needs --tls-cert and --tls-key: it names whom to trust when TLS is on")
        return None
    if not (cert and key):
        raise ValueError("TLS needs both --tls-cert and --tls-key (PEM files: the certificate and its private key)")
    return Tls(Path(cert), Path(key), Path(ca) if ca else None)
