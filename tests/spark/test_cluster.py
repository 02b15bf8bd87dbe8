"""A job on a real Spark standalone cluster: a master and a worker started from the installed
PySpark (spark-class), the word_counts job submitted to it with spark-submit, this
repository's packages shipped to the executors as --py-files (federator_spark.cluster.package), and
what it wrote read back from the changelog."""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import urllib3

from tests.conftest import free_port, stop_process
from tests.integration.changelog_util import read_partition

# about a minute (two JVMs, then the submitted job's): `make spark-cluster` runs it, the default run does not
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not os.environ.get("FEDERATOR_SPARK_CLUSTER"),
                                 reason="make spark-cluster runs it (FEDERATOR_SPARK_CLUSTER=1)")]
BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    # no PYTHONPATH: the executors get this repository only from the shipped zip
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME")}
    env.update(PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR="/tmp")
    return env


def test_word_counts_on_a_standalone_cluster(broker, tmp_path) -> None:
    from federator_spark.cluster.package import build
    from federator_spark.jobs.word_counts import TEXT

    port, ui = free_port(), free_port()
    master_url = f"spark://127.0.0.1:{port}"
    logs = tmp_path / "logs"
    logs.mkdir()
    master = subprocess.Popen([str(BIN / "spark-class"), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(ui)], env=_env(), cwd=tmp_path,
                              stdout=open(logs / "master.log", "w"), stderr=subprocess.STDOUT)
    worker = None
    try:
        worker = subprocess.Popen([str(BIN / "spark-class"), "org.apache.spark.deploy.worker.Worker", master_url,
                                   "--cores", "2", "--memory", "1g", "--work-dir", str(tmp_path / "work"),
                                   "--webui-port", str(free_port())], env=_env(), cwd=tmp_path,
                                  stdout=open(logs / "worker.log", "w"), stderr=subprocess.STDOUT)
        http, deadline = urllib3.PoolManager(retries=False), time.monotonic() + 90
        while True:  # the master's JSON view: the worker has registered
            try:
                state = json.loads(http.request("GET", f"http://127.0.0.1:{ui}/json/", timeout=2).data)
                if any(w["state"] == "ALIVE" for w in state.get("workers", [])):
                    break
            except (urllib3.exceptions.HTTPError, ValueError):
                pass
            assert time.monotonic() < deadline, (logs / "master.log").read_text()[-2000:] + \
                (logs / "worker.log").read_text()[-2000:]
            time.sleep(0.5)

        zip_path = build(tmp_path / "federator-pyfiles.zip")
        app = f"cl{uuid.uuid4().hex[:8]}"
        done = subprocess.run(
            [str(BIN / "spark-submit"), "--master", master_url, "--py-files", str(zip_path),
             "--conf", f"spark.pyspark.python={sys.executable}", "--conf", "spark.executor.memory=512m",
             "--conf", "spark.ui.enabled=false",
             str(REPO / "tests" / "spark" / "cluster_job.py"),
             "--master", master_url, "--bootstrap-servers", broker.bootstrap_servers, "--application-id", app,
             "--partitions", "2"],
            env=_env(), cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        shipped = re.search(r"executors imported federator from: \[(.*)\]", done.stdout)
        assert shipped is not None and "federator-pyfiles.zip" in shipped.group(1), done.stdout
        assert "consistency token: " in done.stdout

        counts = collections.Counter(w.lower() for w in re.findall(r"[^\W\d_]+", TEXT))
        written = {}
        for p in range(2):
            for _, key, value, _ in read_partition(broker, f"{app}-word_counts-changelog", p):
                written[key.decode()] = int.from_bytes(value, "big", signed=True)
        assert written == dict(counts)
    finally:
        for proc in (worker, master):
            if proc is not None:
                stop_process(proc, 30)
