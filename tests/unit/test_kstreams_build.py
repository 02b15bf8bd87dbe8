"""The Kafka Streams test application's build says what to install when a tool is missing."""

from __future__ import annotations

import shutil

import pytest

from tests import maven_cache
from tests.integration import kstreams_app


def test_a_missing_jdk_or_maven_fails_saying_what_to_install(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("FEDERATOR_CACHE", str(tmp_path))  # no build there yet
    real = shutil.which
    monkeypatch.setattr(maven_cache.shutil, "which", lambda tool: None if tool == "mvn" else real(tool))
    with pytest.raises(RuntimeError, match=r"application needs mvn, not found: .*apt-get install .*maven"):
        kstreams_app.built()
    assert not any(tmp_path.iterdir())  # nothing half-built left behind
