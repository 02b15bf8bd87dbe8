"""Running the write's Python tasks in Spark: mapInArrow without pandas, the session settings
pass 2 runs under, and the error a failed task died of, in one line."""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Iterator

# Pass 2's Arrow batches, unless the session sets this itself. Spark checks the byte limit by
# measuring its Arrow vectors after every row (~10% of the JVM's time in pass 2); at its
# largest value it skips that, and the record limit (maxRecordsPerBatch, 10,000 by default)
# alone bounds a batch. Larger batches measured no faster.
PASS2_ARROW_CONF = {"spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1)}

# The exceptions a failed Spark task reaches the driver as.
SPARK_FAILURES = ("PythonException", "Py4JJavaError", "SparkRuntimeException")


@contextlib.contextmanager
def session_conf(spark: Any, conf: dict[str, str], overriding: tuple[str, ...] = ()) -> Iterator[None]:
    """Set ``conf`` on the session for the block (keys the session sets itself are left alone,
    but those in ``overriding``), then take it back."""
    before = {k: spark.conf.get(k, None) for k in conf}
    ours = {k: v for k, v in conf.items() if before[k] is None or k in overriding}
    for k, v in ours.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k in ours:
            if before[k] is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, before[k])


def map_in_arrow(df: Any, func: Callable, ddl: str) -> Any:
    """df.mapInArrow without the pandas that PySpark's public method insists on importing
    (the Arrow path itself never uses pandas)."""
    try:
        import pandas  # noqa: F401
    except ImportError:
        pass
    else:
        return df.mapInArrow(func, ddl)
    from pyspark.rdd import PythonEvalType
    from pyspark.sql import DataFrame
    from pyspark.sql.udf import _create_udf

    udf = _create_udf(func, returnType=ddl, evalType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
    column = udf(*[df[c] for c in df.columns])
    return DataFrame(df._jdf.mapInArrow(column._jc, False, None), df.sparkSession)


def worker_failure(e: Exception) -> str:
    """The Python error a Spark task died of (the last traceback's exception line), in one line."""
    text = str(e)
    at = text.rfind("Traceback (most recent call last):")
    lines = text[at:].splitlines()[1:] if at >= 0 else text.splitlines()
    msg = ""
    for i, ln in enumerate(lines):
        if ln.strip() and not ln.startswith((" ", "\t")):
            msg = " ".join(x.strip() for x in lines[i:] if x.strip())
            break
    msg = (msg or text.strip() or repr(e))[:800]
    if "ModuleNotFoundError" in msg or "ImportError" in msg:
        msg += (f" (Spark's Python workers cannot import it: set PYSPARK_PYTHON={sys.executable} before the "
                "SparkSession starts, and put this repository on PYTHONPATH; "
                "federator_spark.jobs.common.spark_session does both)")
    return msg
