"""The node's settings (federator.settings): flags, environment and a TOML file fill one typed
configuration in that order of precedence; a bad file is an error naming the key; --print-config
masks secrets; the docs' table and sample file are made from the same table."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from federator.cli import build_parser, main
from federator.settings import BY_NAME, CACHES, DEFAULT, ENV, FILE, FLAG, MASK, SETTINGS, NodeSettings, from_args, \
    sample_toml

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = ["--application-id", "app", "--state-dir", "/tmp/state"]


def _resolve(argv: list[str], environ: dict[str, str] | None = None):
    return from_args(build_parser().parse_args(["node", *argv]), environ or {})


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "node.toml"
    path.write_text(text)
    return str(path)


def test_a_flag_wins_over_the_environment_which_wins_over_the_file(tmp_path: Path) -> None:
    config = _file(tmp_path, 'server = "waitress"\ntls_ca = "file.pem"\nthreads = 30\nmax_body_bytes = "1MiB"\n')
    environ = {"FEDERATOR_HTTP_SERVER": "granian", "FEDERATOR_TLS_CA": "env.pem"}
    resolved = _resolve([*REQUIRED, "--config", config, "--tls-ca", "flag.pem"], environ)
    st = resolved.settings
    assert (st.tls_ca, resolved.sources["tls_ca"]) == ("flag.pem", FLAG)
    assert (st.server, resolved.sources["server"]) == ("granian", ENV)
    assert (st.threads, resolved.sources["threads"]) == (30, FILE)
    assert (st.max_body_bytes, resolved.sources["max_body_bytes"]) == (1024 * 1024, FILE)
    assert (st.shard_answers, resolved.sources["shard_answers"]) == (NodeSettings.shard_answers, DEFAULT)


def test_a_renamed_setting_is_still_taken_by_its_former_flag_and_file_key_with_a_warning(tmp_path: Path) -> None:
    with pytest.warns(FutureWarning, match="--kept-answers is deprecated: it is now --shard-answers"):
        resolved = _resolve([*REQUIRED, "--kept-answers", "3"])
    assert (resolved.settings.shard_answers, resolved.sources["shard_answers"]) == (3, FLAG)
    with pytest.warns(FutureWarning, match="kept_answers is deprecated: it is now shard_answers"):
        resolved = _resolve([*REQUIRED, "--config", _file(tmp_path, "kept_answers = 5\n")])
    assert (resolved.settings.shard_answers, resolved.sources["shard_answers"]) == (5, FILE)
    # the new name wins over the former one, as a flag over the file
    with pytest.warns(FutureWarning):
        resolved = _resolve([*REQUIRED, "--shard-answers", "7", "--config", _file(tmp_path, "kept_answers = 5\n")])
    assert resolved.settings.shard_answers == 7


def test_the_file_alone_can_name_the_required_settings(tmp_path: Path) -> None:
    config = _file(tmp_path, 'application_id = "fromfile"\nstate_dir = "/srv/n"\nkey_port = "off"\n'
                             "reuse_answers_seconds = 2\n")
    st = _resolve(["--config", config]).settings
    assert (st.application_id, st.state_dir, st.key_port, st.reuse_answers_seconds) == ("fromfile", "/srv/n", None, 2.0)
    with pytest.raises(ValueError, match="--state-dir is required: .* state_dir in --config FILE"):
        _resolve(["--application-id", "a"])


@pytest.mark.parametrize("text, message", [
    ("scan_cache_mbs = 1\n", "unknown setting 'scan_cache_mbs': did you mean scan_cache_mb?"),
    ("scan-cache-mb = 1\n", "unknown setting 'scan-cache-mb': did you mean scan_cache_mb?"),
    ('threads = "16"\n', "threads in .* must be a whole number, got str '16'"),
    ("allow_anonymous = 1\n", "allow_anonymous in .* must be true or false, got int 1"),
    ("scan_cache_mb = true\n", "scan_cache_mb in .* must be a whole number, got bool True"),
    ('server = "nginx"\n', "server in .* must be one of 'granian', 'waitress', 'loop', got 'nginx'"),
    ('max_answer_bytes = "lots"\n', "max_answer_bytes in .* must be a size"),
    ("pg_port = 70000\n", "pg_port in .* must be a port, 0-65535, got 70000"),
    ('key_port = "none"\n', "key_port in .* must be a port, 0-65535, or \"off\", got str 'none'"),
    ("threads = \n", "is not TOML"),
])
def test_a_bad_file_names_the_key_and_what_to_write(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _resolve([*REQUIRED, "--config", _file(tmp_path, text)])


def test_a_bad_file_exits_2_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["node", *REQUIRED, "--config", _file(tmp_path, "threds = 4\n")]) == 2
    assert "unknown setting 'threds': did you mean threads?" in capsys.readouterr().err
    assert main(["node", *REQUIRED, "--config", str(tmp_path / "missing.toml")]) == 2
    assert "cannot read --config" in capsys.readouterr().err


def test_a_bad_variable_names_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\$FEDERATOR_HTTP_SERVER must be one of"):
        _resolve(REQUIRED, {"FEDERATOR_HTTP_SERVER": "apache"})


def test_print_config_masks_the_secret_and_reads_back(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "s3cret-s3cret-s3cret"
    monkeypatch.setenv("FEDERATOR_CLUSTER_SECRET", secret)
    config = _file(tmp_path, "pg_port = 6543\n")
    assert main(["node", *REQUIRED, "--config", config, "--max-answer-bytes", "64MiB", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert secret not in out and f'cluster_secret = "{MASK}"  # environment (secret)' in out
    assert 'max_answer_bytes = "64MiB"  # flag' in out and "pg_port = 6543  # file" in out
    printed = tomllib.loads(out)
    assert printed["max_answer_bytes"] == "64MiB" and printed["application_id"] == "app"
    # read back as a --config file, it gives the same settings (the masked secret aside)
    monkeypatch.delenv("FEDERATOR_CLUSTER_SECRET")
    again = _resolve(["--config", _file(tmp_path, out)]).settings
    assert (again.max_answer_bytes, again.pg_port, again.cluster_secret) == (64 * 1024**2, 6543, MASK)


def test_print_config_shows_what_is_missing_instead_of_failing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["node", "--print-config"]) == 0
    assert "# application_id =  (required, unset)" in capsys.readouterr().out


def test_every_setting_is_a_flag_and_only_flags_given_count_as_flags() -> None:
    assert {name for name, source in _resolve(REQUIRED).sources.items() if source == FLAG} == \
        {"application_id", "state_dir"}
    for s in SETTINGS:
        if s.kind is bool:
            argv, expected = [s.flag], True
        else:
            text = {int: "7", float: "1.5", str: (s.meta.choices or ("x",))[-1]}[s.kind]
            argv, expected = [s.flag, text], {int: 7, float: 1.5, str: text}[s.kind]
        resolved = _resolve([*REQUIRED, *argv])
        assert (getattr(resolved.settings, s.name), resolved.sources[s.name]) == (expected, FLAG), s.name


def test_the_sample_file_is_generated_and_gives_the_defaults() -> None:
    sample = ROOT / "docs/reference/node.toml"
    assert sample.read_text() == sample_toml(), (
        f"regenerate it: {sys.executable} -c 'from federator.settings import sample_toml; "
        f"print(sample_toml(), end=\"\")' > docs/reference/node.toml")
    st = _resolve(["--config", str(sample), *REQUIRED]).settings
    assert st == NodeSettings(application_id="app", state_dir="/tmp/state")


def test_the_docs_table_names_every_setting_flag_and_variable() -> None:
    sys.path.insert(0, str(ROOT / "docs/hooks"))
    try:
        import cli_reference
    finally:
        sys.path.remove(str(ROOT / "docs/hooks"))
    table = cli_reference.settings_table()
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) == len(SETTINGS)
    for s, row in zip(SETTINGS, rows):
        assert row.startswith(f"| `{s.name}` | `{s.flag}` | " + (f"`{s.meta.env}`" if s.meta.env else ""))
    page = (ROOT / "docs/reference/cli.md").read_text()
    assert cli_reference.SETTINGS_MARKER in page and cli_reference.MARKER in page
    assert cli_reference.CACHES_MARKER in page
    assert [line.split(" | ")[0] for line in cli_reference.caches_table().splitlines()[2:] if line] == \
        [f"| {c.name}" for c in CACHES]


def test_every_cache_names_its_module_and_settings_that_exist() -> None:
    import importlib.util
    import re

    for cache in CACHES:
        assert importlib.util.find_spec(cache.module) is not None, cache
        for flag in re.findall(r"--[a-z-]+", cache.bound):
            assert flag[2:].replace("-", "_") in BY_NAME, (cache.name, flag)


@pytest.mark.parametrize("flags, environ, file, expected", [
    (["--cluster-secret", "a" * 16], {}, 'cluster_secret_file = "{path}"\n', "a" * 16),  # the flag wins
    ([], {"FEDERATOR_CLUSTER_SECRET": "e" * 16}, 'cluster_secret_file = "{path}"\n', "e" * 16),
    ([], {"FEDERATOR_CLUSTER_SECRET": "e" * 16, "FEDERATOR_CLUSTER_SECRET_FILE": "{path}"}, "", "f" * 16),
    (["--cluster-secret", "a" * 16, "--cluster-secret-file", "{path}"], {}, "", "pass the cluster secret once"),
    ([], {}, 'cluster_secret = "{secret}"\ncluster_secret_file = "{path}"\n', "pass the cluster secret once"),
])
def test_the_cluster_secret_comes_from_the_stronger_source(tmp_path: Path, flags, environ, file, expected) -> None:
    from federator.node_command import _cluster_secret

    path = tmp_path / "secret"
    path.write_text("f" * 16 + "\n")
    fill = {"path": str(path), "secret": "s" * 16}
    argv = [*REQUIRED, *(f.format(**fill) for f in flags)]
    if file:
        argv += ["--config", _file(tmp_path, file.format(**fill))]
    resolved = _resolve(argv, {k: v.format(**fill) for k, v in environ.items()})
    if expected.startswith("pass"):
        with pytest.raises(ValueError, match=expected):
            _cluster_secret(resolved, "127.0.0.1", None)
    else:
        assert _cluster_secret(resolved, "127.0.0.1", None) == expected


def test_print_config_reads_back_any_string(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    odd = 'C:\\state "n1"\tü'
    assert main(["node", *REQUIRED, "--node-id", odd, "--print-config"]) == 0
    again = _resolve(["--config", _file(tmp_path, capsys.readouterr().out)]).settings
    assert again.node_id == odd


@pytest.mark.parametrize("wait", ["-1", "300001"])
def test_a_fetch_wait_the_kafka_client_refuses_exits_2_naming_the_flag(wait, tmp_path, capsys) -> None:
    assert main(["node", "--application-id", "a", "--state-dir", str(tmp_path / "n"), "--fetch-wait-ms", wait]) == 2
    err = capsys.readouterr().err
    assert "--fetch-wait-ms must be 0 to 300000" in err and f"got {wait}" in err, err
