"""The one SparkSession factory (STYLE: one way to do each thing).

Local by default (`local[*]`, settings for a small machine), Delta extensions and catalog always, and Delta's
jars only when nobody else provides them: on Databricks, or under `spark-submit --packages`, the cluster already
has them and the factory just returns the running session.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DELTA_SCALA = "2.13"
#: The jar Spark downloads must match the pinned delta-spark wheel (requirements.txt).
DELTA_VERSION = "4.4.0"
_DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
_REPO_ROOT = Path(__file__).resolve().parent.parent


def delta_package() -> str:
    """Maven coordinate of Delta for the installed pyspark (`delta-spark_<spark major.minor>_2.13`)."""
    import pyspark

    major_minor = ".".join(pyspark.__version__.split(".")[:2])
    return f"io.delta:delta-spark_{major_minor}_{DELTA_SCALA}:{DELTA_VERSION}"


def jars_dir() -> Path:
    return Path(os.environ.get("REPLAB_JARS_DIR", _REPO_ROOT / ".cache" / "jars"))


def cached_jars() -> list[str] | None:
    """Jars resolved by an earlier run, so that later runs start without Maven Central."""
    listing = jars_dir() / f"{delta_package().replace(':', '_')}.list"
    if not listing.is_file():
        return None
    jars = [line.strip() for line in listing.read_text().splitlines() if line.strip()]
    return jars if jars and all(Path(j).is_file() for j in jars) else None


def _remember_jars() -> None:
    ivy_jars = jars_dir() / "ivy" / "jars"
    if ivy_jars.is_dir():
        listing = jars_dir() / f"{delta_package().replace(':', '_')}.list"
        listing.write_text("\n".join(str(p) for p in sorted(ivy_jars.glob("*.jar"))) + "\n")


def _running_on_cluster_session() -> bool:
    # Databricks notebooks/jobs and spark-submit start the JVM before our code runs: configs such as
    # spark.jars.packages can no longer be applied, and the platform decides what is on the classpath.
    return "DATABRICKS_RUNTIME_VERSION" in os.environ or "PYSPARK_GATEWAY_PORT" in os.environ


#: Spark keeps the classes it generates for projections and stages in a cache of 100 by default. A replay's
#: tail, gates and MLflow views generate about 480 (each new query shape its own), so in a session that stays up
#: (a notebook, the test suite, a sweep) every replay compiled them all again, a quarter of the driver JVM's
#: time in a small replay. Held, a later replay compiles none. A generated class is a few kB; a static conf
#: (session start).
_CODEGEN_CONF = {"spark.sql.codegen.cache.maxEntries": "4096"}


#: HotSpot's tiered JIT stopped at its first compiler, C1, for a JVM that runs one small job and exits
#: (`get_spark(short_lived=True)`; in local mode the executors share the driver's JVM). A fresh JVM replaying three
#: messages spent a third of its CPU in C2 compiling Spark's, Delta's and Arrow's code for work that ends before
#: C2's code pays off. A long replay's time is the JVM's hot loops (shuffle, sort,
#: Parquet), where C2's code wins: `engine.replay.short_lived_jvm` says when a replay is small enough.
C1_ONLY = "-XX:TieredStopAtLevel=1"


def get_spark(
    app_name: str = "replab",
    *,
    master: str | None = None,
    shuffle_partitions: int | None = None,
    ui: bool | None = None,
    extra_conf: dict[str, str] | None = None,
    short_lived: bool = False,
):
    """Return the SparkSession every replab job and test uses. `short_lived`: the process runs one small job
    and exits, so a JVM this call starts compiles with C1 only (C1_ONLY; no effect on a session already up)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if _running_on_cluster_session():
        spark = _cluster_session(app_name)
        _check_delta(spark)
        return spark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    cores = os.cpu_count() or 2
    master = master or os.environ.get("REPLAB_SPARK_MASTER", "local[*]")
    if ui is None:
        ui = os.environ.get("REPLAB_SPARK_UI", "0") == "1"
    conf = {
        **_DELTA_CONF,
        "spark.app.name": app_name,
        "spark.master": master,
        "spark.driver.memory": os.environ.get("REPLAB_DRIVER_MEMORY", "4g"),
        "spark.sql.shuffle.partitions": str(shuffle_partitions or max(2, 2 * cores)),
        "spark.default.parallelism": str(max(2, 2 * cores)),
        "spark.sql.adaptive.enabled": "true",
        "spark.ui.enabled": str(ui).lower(),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "65536",
        # Any other value makes Spark re-measure the Arrow batch it is building for a mapInArrow after every row
        # it adds (BatchedPythonArrowInput.writeSizedBatch sums each vector's buffer sizes); Int.MaxValue turns
        # the check off. Batches stay bounded by the row count above.
        "spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1),
        "spark.sql.execution.pythonUDF.arrow.enabled": "true",
        # transformWithStateInPandas needs RocksDB (the default store cannot hold several column families).
        "spark.sql.streaming.stateStore.providerClass":
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        # Delta's snapshot reconstruction defaults to 50 tasks. A replay's tables hold tens to hundreds of files
        # and a replay reconstructs about 30 snapshots: one task each measured ~4 s faster per replay than two.
        "spark.databricks.delta.snapshotPartitions": "1",
        "spark.databricks.delta.optimizeWrite.enabled": "false",
        **_CODEGEN_CONF,
        "spark.sql.warehouse.dir": os.environ.get("REPLAB_WAREHOUSE_DIR", str(Path.cwd() / "spark-warehouse")),
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={_REPO_ROOT / 'conf' / 'log4j2.properties'}"
                                         + (f" {C1_ONLY}" if short_lived else ""),
    }
    jars = cached_jars()
    if jars:
        conf["spark.jars"] = ",".join(jars)
    else:
        conf["spark.jars.packages"] = delta_package()
        conf["spark.jars.ivy"] = str(jars_dir() / "ivy")
    conf.update(extra_conf or {})
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("REPLAB_SPARK_LOG_LEVEL", "ERROR"))
    if not jars:
        _remember_jars()
    return spark


#: Settings a session started by spark-submit gets unless the submitter chose otherwise (`--conf` wins): Delta's
#: extension and catalog (static SQL confs, so they must be set before the first session exists; the jars
#: themselves come from --packages/--jars), and the settings replab's outputs depend on (UTC timestamps, Arrow
#: for the kernels' mapInArrow, RocksDB for stream mode), and the codegen cache's size (another static conf).
#: Memory, master and parallelism belong to the submitter.
_CLUSTER_DEFAULTS = {
    **_DELTA_CONF,
    **_CODEGEN_CONF,
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.pythonUDF.arrow.enabled": "true",
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}


def _cluster_session(app_name: str):
    """The session of a process whose JVM someone else started (spark-submit, Databricks): never a download."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if SparkContext._active_spark_context is None:
        # spark-submit has launched the JVM but no SparkContext yet: SparkConf() reads what --conf/--packages
        # set, and only the missing defaults are added.
        submitted = SparkConf()
        for key, value in _CLUSTER_DEFAULTS.items():
            if not submitted.contains(key):
                builder = builder.config(key, value)
    return builder.getOrCreate()


def _check_delta(spark) -> None:
    jvm = spark.sparkContext._jvm
    try:
        # Through the thread's context class loader: jars given to spark-submit (--jars, --packages) are on that
        # loader, not on the one Class.forName(name) would use (the JVM's application class path).
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName("io.delta.tables.DeltaTable", False, loader)
    except Exception as exc:  # py4j wraps ClassNotFoundException
        from schemas.errors import ReplabError

        raise ReplabError(
            f"Delta Lake is not on this cluster's classpath: add --packages {delta_package()} to spark-submit "
            "(SPEC §6.2), or use a Databricks runtime with Delta"
        ) from exc


@contextmanager
def session_conf(spark, key: str, value: str) -> Iterator[None]:
    """The block runs with a session setting changed, restored after (unset again if it was unset). Settings are
    the session's: use it where no other thread runs queries meanwhile."""
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


def adaptive_off(spark):
    """Run the block's queries with one static plan each: adaptive execution makes every shuffle stage a Spark
    job of its own, which costs more than it saves on a query over small cached frames with many shuffles (the
    output gate's one query)."""
    return session_conf(spark, "spark.sql.adaptive.enabled", "false")


#: Spark's own interpreted evaluation for every expression, projection, predicate and ordering (each of its code
#: generators has an interpreted fallback; `factoryMode` picks it, and whole-stage code generation is off). Spark
#: otherwise generates and compiles (Janino) a Java class for every new shape of query it runs: a replay's gates,
#: tail and Delta commits are about 350-400 shapes, and in a fresh JVM compiling them is a fifth of a small
#: replay. Interpreted rows cost more each: see `engine.replay.SMALL_REPLAY_OUTCOMES` for where that wins.
INTERPRETED_CONF = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}


@contextmanager
def interpreted_expressions(spark) -> Iterator[None]:
    """The block's queries run on Spark's interpreted expressions (INTERPRETED_CONF), restored after."""
    from contextlib import ExitStack

    with ExitStack() as stack:
        for key, value in INTERPRETED_CONF.items():
            stack.enter_context(session_conf(spark, key, value))
        yield


def uncompressed_cache(spark):
    """Frames cached (filled) in the block are stored uncompressed. A replay's tail caches its tables for the
    output gate and the Delta writes, each read several times: compressing 3.7 M message outcomes (16 runs) while
    caching them took 6.9-7.6 s, against 3.1-3.9 s uncompressed, and reading them back took the same time either
    way (0.5-0.7 s). The block should hold both the `persist()` calls and the queries that fill the caches."""
    return session_conf(spark, "spark.sql.inMemoryColumnarStorage.compressed", "false")


def local_frame(spark, rows: Sequence[Sequence[Any]], schema: str | Any):
    """`spark.createDataFrame(rows, schema)` for a small list built on the driver (control tables, run records),
    handed over as one Arrow batch: a Python list goes through a Python RDD of `defaultParallelism` slices,
    so every query reading it starts that many Python tasks (Python workers to pickle a handful of rows). The
    Arrow path is read by the JVM, in one partition. `schema`: a DDL string or a StructType."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    struct = schema if isinstance(schema, StructType) else StructType.fromDDL(schema)
    arrow_schema = to_arrow_schema(struct)
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(struct.fields)
    table = pa.table([pa.array(list(col), type=field.type) for col, field in zip(columns, arrow_schema,
                                                                                 strict=True)],
                     schema=arrow_schema)
    return spark.createDataFrame(table, schema=struct)
