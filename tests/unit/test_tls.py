"""The node's TLS settings from its flags, without a node."""

from __future__ import annotations

import ssl

import pytest

from federator.tls import from_flags
from tests.certificates import make_certificate


def test_no_flags_is_no_tls_and_half_a_pair_is_refused(tmp_path) -> None:
    assert from_flags(None, None) is None
    with pytest.raises(ValueError, match="both --tls-cert and --tls-key"):
        from_flags("a.pem", None)
    with pytest.raises(ValueError, match="--tls-ca needs --tls-cert"):
        from_flags(None, None, "ca.pem")


def test_a_certificate_makes_server_and_client_contexts_that_trust_it(tmp_path) -> None:
    cert, key = make_certificate(tmp_path)
    tls = from_flags(str(cert), str(key))
    assert tls is not None and tls.ca is None
    assert tls.client.verify_mode == ssl.CERT_REQUIRED and tls.client.check_hostname
    assert [c["subject"] for c in tls.client.get_ca_certs()] == [((("commonName", "federator-test"),),)]
    _, other_key = make_certificate(tmp_path, "other")
    with pytest.raises(ValueError, match="check that the key belongs"):
        from_flags(str(cert), str(other_key))
    with pytest.raises(ValueError, match="--tls-ca 'missing.pem' is not a readable file"):
        from_flags(str(cert), str(key), "missing.pem")
