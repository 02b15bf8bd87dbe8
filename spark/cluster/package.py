"""The zip that `spark-submit --py-files` ships to executors: this repository's packages
(federator, and spark/ and plugins/ as federator_spark and federator_plugins), so executors import them from it, as Spark documents for Python
dependencies of one's own. Third-party libraries (pyarrow, confluent-kafka, ...) come from the
executors' Python (`spark.pyspark.python`), which must have federator's requirements installed.

    python -m federator_spark.cluster.package dist/federator-pyfiles.zip
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# the repository's folder -> the package name it installs as (setup.py)
PACKAGES = {"federator": "federator", "spark": "federator_spark", "plugins": "federator_plugins"}


def build(target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for folder, package in PACKAGES.items():
            for path in sorted((REPO / folder).rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                    z.write(path, f"{package}/{path.relative_to(REPO / folder).as_posix()}")
    return target


if __name__ == "__main__":
    out = build(Path(sys.argv[1] if len(sys.argv) > 1 else "dist/federator-pyfiles.zip"))
    print(out)
