"""The client properties file (`--kafka-config`): what it accepts, what it refuses and says why,
and that its secrets never show."""

from __future__ import annotations

import pytest

from federator import kafka
from federator.cli import main
from federator.kafka_properties import KafkaConfigError, load


def write(tmp_path, text: str):
    path = tmp_path / "client.properties"
    path.write_text(text)
    return path


def test_a_java_style_file_gives_every_client_its_properties(tmp_path) -> None:
    path = write(tmp_path, "# managed cluster\n! also a comment\n\nsecurity.protocol = SASL_PLAINTEXT\n"
                           "sasl.mechanism: SCRAM-SHA-256\nsasl.username=app\nsasl.password=p=ss:word\n")
    props = load(path)
    assert dict(props.values) == {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                                  "sasl.username": "app", "sasl.password": "p=ss:word"}
    kafka.use_client_properties("10.0.0.1:9092", props)
    conf = kafka.base_config("10.0.0.1:9092")
    assert conf["sasl.password"] == "p=ss:word" and conf["bootstrap.servers"] == "10.0.0.1:9092"
    assert "p=ss:word" not in repr(props) and "sasl.username': 'app'" in repr(props)
    assert props.redact("failed for app with p=ss:word") == "failed for app with ***"


@pytest.mark.parametrize("text, says", [
    ("security.protocol SASL_SSL\n", "line 1: expected NAME=VALUE"),
    ("ssl.truststore.location=/etc/kafka/truststore.jks\n", "Java TrustStores are not supported"),
    ("sasl.passwrod=secret-1\n", 'No such configuration property: "sasl.passwrod"'),
    ("sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
     'username="a" password="secret-1";\n', "give sasl.username and sasl.password instead"),
    ("security.protocol=SASL_TLS\n", "security.protocol"),
])
def test_a_file_librdkafka_cannot_use_is_refused_saying_what_is_wrong(tmp_path, text, says) -> None:
    path = write(tmp_path, text)
    with pytest.raises(KafkaConfigError, match="client.properties") as caught:
        load(path)
    assert says in str(caught.value) and "secret-1" not in str(caught.value)


def test_the_cli_refuses_a_missing_file_with_exit_code_2(tmp_path, capsys) -> None:
    code = main(["store", "list", "--application-id", "a", "--kafka-config", str(tmp_path / "nope.properties")])
    assert code == 2
    assert "cannot read the Kafka client properties file" in capsys.readouterr().err
