"""The client properties a Kafka cluster asks of every client (security.protocol, SASL, TLS, or any
librdkafka property), given as a properties file the way Kafka's own tools take --command-config:
`--kafka-config FILE` or $FEDERATOR_KAFKA_CONFIG. federator.kafka.base_config applies them to
every client Federator makes. Secret values never leave this module's ClientProperties except
into a client's configuration: its repr and every message it makes show them as ***."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping
from federator.errors import FederatorError

CONFIG_ENV = "FEDERATOR_KAFKA_CONFIG"
# What names a property whose value is a secret (sasl.password, ssl.key.password,
# sasl.oauthbearer.client.secret, an inline private key, ...): never shown
_SECRET_WORDS = ("password", "secret", "ssl.key.pem", "sasl.jaas.config", "sasl.oauthbearer.config")


class KafkaConfigError(FederatorError, ValueError):
    """A client properties file that cannot be used; the message says what to change."""

    code = "INVALID_PARAMETER"


def is_secret(name: str) -> bool:
    return any(word in name for word in _SECRET_WORDS)


@dataclass(frozen=True)
class ClientProperties:
    """Client properties and where they came from (a file's path, for messages)."""

    values: Mapping[str, str] = field(default_factory=dict)
    source: str = "no client properties"

    def __repr__(self) -> str:
        shown = {k: "***" if is_secret(k) else v for k, v in self.values.items()}
        return f"ClientProperties({shown!r}, source={self.source!r})"

    def get(self, name: str, default: str = "") -> str:
        return self.values.get(name, default)

    def redact(self, text: str) -> str:
        """``text`` with every secret value in it replaced by ***."""
        for name, value in self.values.items():
            if is_secret(name) and value:
                text = text.replace(value, "***")
        return text


def parse(text: str, source: str) -> dict[str, str]:
    """A Java properties file's ``key=value`` (or ``key: value``) lines; # and ! start comments."""
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        if cut < 0:
            raise KafkaConfigError(f"{source}, line {number}: expected NAME=VALUE (a Kafka client property)")
        out[line[:cut].strip()] = line[cut + 1:].strip()
    return out


def _check(values: dict[str, str], source: str) -> None:
    """librdkafka's own check of each name and value, before any client is made with them."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    if "sasl.jaas.config" in values:
        raise KafkaConfigError(f"{source}: sasl.jaas.config is the Java client's; give sasl.username and "
                               "sasl.password instead (with sasl.mechanism)")
    try:
        AdminClient({**values, "bootstrap.servers": "127.0.0.1:1"})  # never asked anything
    except KafkaException as e:
        raise KafkaConfigError(f"{source}: {ClientProperties(values).redact(e.args[0].str())}") from None


def load(path: str | os.PathLike) -> ClientProperties:
    """The client properties in the file at ``path``, checked."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise KafkaConfigError(f"cannot read the Kafka client properties file {source}: {e.strerror}") from None
    values = parse(text, source)
    _check(values, source)
    return ClientProperties(values, source)


def from_environment() -> ClientProperties:
    """What $FEDERATOR_KAFKA_CONFIG names, or none."""
    path = os.environ.get(CONFIG_ENV)
    return load(path) if path else ClientProperties()
