"""Apache Spark behind the backend seam: the same generated SQL, transpiled to Spark's dialect.

The session is unchanged: it parses, plans, prices and charges in dpsql, asks
``dpsql.sql.generate`` for the bounded aggregate in ``SparkBackend.dialect`` (sqlglot transpiles
it), sends that to Spark, and adds noise to the aggregated rows that come back. Spark never draws
randomness for dpsql and never sees the analyst's SQL. PySpark is optional
(``pip install dpsql[spark]``); it is imported only when a Spark backend is made.

Dialect differences that would change results, and how the generated SQL avoids them:

- ``HASH`` is DuckDB's own hash in DuckDB and murmur3 in Spark: the salted order in which a unit
  keeps its groups uses portable arithmetic and ``MD5`` instead (``generate._salted_order``).
- ``TRUNC(x)`` truncates in DuckDB, while Spark's ``TRUNC`` truncates dates and DuckDB's
  ``CAST(x AS BIGINT)`` rounds: sqlglot writes ``CAST(x AS BIGINT)`` for Spark, which truncates.
- ``ROUND`` rounds half away from zero in both; ``ISNAN``, ``LEAST``/``GREATEST`` (inputs are
  never NULL there) and ``/`` on doubles agree.
- Window ``ORDER BY`` puts NULLs last in DuckDB and first in Spark: sqlglot adds ``NULLS LAST``.
- Timestamps: Spark's ``TIMESTAMP`` follows the session time zone; ``local_spark`` sets UTC.
- ``SUM`` of ``BIGINT`` widens to ``HUGEINT`` in DuckDB but stays ``BIGINT`` in Spark, which
  wraps silently on overflow unless ANSI mode is on; ``local_spark`` turns it on (a failure
  then, never a wrong sum). Overflow needs more than 2**63 grid units in one cell.
- Float group keys print differently (``1e+20`` against ``1.0E20``), so when contribution bounds
  bind on float keys the two engines may keep different groups; other key types agree.

Only DuckDB restricts which files a query may read (``DuckDBBackend``); Spark reads what it is
given, and dpsql sends it only generated SQL over the tables registered here.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pandas as pd
from sqlglot import exp

from dpsql.engine.backends import Rows
from dpsql.engine.policy import Policy
from dpsql.engine.progress import READING_DATA, Progress
from dpsql.engine.sources import FileSource, file_source, policy_sources
from dpsql.errors import FAILED_AFTER_CHARGE, ExecutionError, ParameterError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

T = TypeVar("T")

__all__ = ["SparkBackend", "local_spark", "spark_type_name", "spark_unavailable"]


def spark_unavailable() -> str | None:
    """Why a local Spark cannot start here (PySpark or Java missing), or ``None`` if it can."""
    if importlib.util.find_spec("pyspark") is None:
        return "PySpark is not installed (pip install dpsql[spark])"
    java_home = os.environ.get("JAVA_HOME")
    if shutil.which("java") is None and not (java_home and Path(java_home, "bin", "java").exists()):
        return "Java is not installed (Spark needs a Java runtime; set JAVA_HOME or PATH)"
    return None


def local_spark(threads: int = 1, **conf: str) -> SparkSession:
    """A local Spark session (``local[threads]``) set up for dpsql: UTC session time zone, ANSI
    arithmetic, no web UI, few shuffle partitions, Arrow transfers. ``conf`` adds settings.

    An existing session in this process is returned as it is (Spark allows one per process).
    """
    reason = spark_unavailable()
    if reason is not None:
        raise ExecutionError(f"cannot start Spark: {reason}")
    from pyspark.sql import SparkSession

    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.ansi.enabled": "true",
        "spark.sql.shuffle.partitions": str(max(1, 2 * threads)),
        "spark.default.parallelism": str(max(1, threads)),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
        **conf,
    }
    builder = SparkSession.builder.master(f"local[{int(threads)}]").appName("dpsql")
    for key, value in settings.items():
        builder = builder.config(key, value)
    with _quiet_pyspark():
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


_TYPE_NAMES = {
    "string": "VARCHAR",
    "tinyint": "TINYINT",
    "smallint": "SMALLINT",
    "int": "INTEGER",
    "bigint": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "boolean": "BOOLEAN",
    "date": "DATE",
    "timestamp": "TIMESTAMP WITH TIME ZONE",
    "timestamp_ntz": "TIMESTAMP",
}


def spark_type_name(simple: str) -> str:
    """A Spark type (its ``simpleString``) as the DuckDB type name dpsql classifies.

    >>> [spark_type_name(t) for t in ("bigint", "decimal(10,2)", "varchar(8)", "array<int>")]
    ['BIGINT', 'DECIMAL(10,2)', 'VARCHAR', 'ARRAY<INT>']
    """
    simple = simple.lower()
    if simple in _TYPE_NAMES:
        return _TYPE_NAMES[simple]
    if simple.startswith("decimal"):
        return simple.upper()
    if simple.startswith(("varchar", "char")):
        return "VARCHAR"
    return simple.upper()


@contextlib.contextmanager
def _quiet_pyspark() -> Iterator[None]:
    """Silence PySpark's own warnings (e.g. about pandas versions it has not certified)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"pyspark(\.|$)")
        yield


class SparkBackend:
    """Tables in a Spark session, answered by Spark SQL.

    ``tables`` maps a table name to a Spark DataFrame, a pandas DataFrame, or a ``FileSource``
    (Parquet or CSV files); each becomes a temporary view of that name in ``spark`` (default:
    ``local_spark()``). The caller owns the Spark session: ``close`` drops the views, not the
    session. Views are per session, so two backends on one session must not share table names.
    """

    dialect = "spark"

    def __init__(
        self, spark: SparkSession | None = None, *, tables: Mapping[str, Any] | None = None
    ):
        self.spark = spark if spark is not None else local_spark()
        self._frames: dict[str, DataFrame] = {}
        self._catalog: dict[str, dict[str, str]] | None = None
        for name, data in (tables or {}).items():
            self.register(name, data)

    @classmethod
    def for_policy(
        cls, database: str | Path | None, policy: Policy, spark: SparkSession | None = None
    ) -> SparkBackend:
        """A backend over the policy's file sources (relative to the database's directory)."""
        return cls(spark, tables={s.table: s for s in policy_sources(policy, database)})

    def register(self, name: str, data: Any) -> None:
        """Expose ``data`` (Spark or pandas DataFrame, ``FileSource``, or a Parquet/CSV path or
        glob) as table ``name``."""
        if not isinstance(name, str) or not name:
            raise ParameterError(f"name must be a non-empty table name, got {name!r}")
        if name.lower() in {table.lower() for table in self._frames}:
            raise ParameterError(f"a table named {name!r} already exists; choose another name")
        if isinstance(data, (str, Path)):
            data = file_source(name, str(data))
        frame = self._frame(name, data)
        frame.createOrReplaceTempView(name)
        self._frames[name] = frame
        self._catalog = None

    def _frame(self, name: str, data: Any) -> DataFrame:
        from pyspark.sql import DataFrame

        if isinstance(data, DataFrame):
            return data
        if isinstance(data, pd.DataFrame):
            with _quiet_pyspark():
                return self.spark.createDataFrame(data)
        if isinstance(data, FileSource):
            paths = [str(p) for p in data.files]
            if data.format == "parquet":
                return self.spark.read.parquet(*paths)
            if not data.columns:
                raise ParameterError(
                    f"the CSV source of table {name!r} needs declared columns (FileSource.columns)"
                )
            quoted = {column: "`" + column.replace("`", "``") + "`" for column, _ in data.columns}
            text = ", ".join(f"{quoted[column]} STRING" for column, _ in data.columns)
            frame = self.spark.read.csv(
                paths, header=data.header, schema=text, sep=data.delimiter, quote='"', escape='"'
            )
            return frame.selectExpr(
                *(
                    f"try_cast({quoted[column]} AS "
                    f"{exp.DataType.build(type_name, dialect='duckdb').sql(dialect='spark')}) "
                    f"AS {quoted[column]}"
                    for column, type_name in data.columns
                )
            )
        raise ParameterError(
            f"cannot register {type(data).__name__} as table {name!r}: pass a Spark or pandas "
            "DataFrame, a FileSource, or a Parquet/CSV path"
        )

    def catalog(self) -> dict[str, dict[str, str]]:
        if self._catalog is None:
            self._catalog = {
                name: {f.name: spark_type_name(f.dataType.simpleString()) for f in frame.schema}
                for name, frame in self._frames.items()
            }
        return self._catalog

    def run(self, sql: str, progress: Progress | None = None) -> pd.DataFrame:
        """Run generated SQL; with ``progress``, report "reading data" as unknown (``None``)
        until Spark returns, then 1.0 (Spark's stage counts do not add up to a fraction of a
        whole SQL query)."""
        return self._read(sql, progress, lambda result: result.toPandas())

    def rows(self, sql: str, progress: Progress | None = None) -> Rows:
        """Run generated SQL whose result is small (an aggregated answer) and return its rows
        (``collect``: no pandas), reporting progress as ``run`` does."""
        return self._read(
            sql,
            progress,
            lambda result: Rows(tuple(result.columns), [tuple(row) for row in result.collect()]),
        )

    def _read(self, sql: str, progress: Progress | None, read: Callable[[DataFrame], T]) -> T:
        if progress is not None:
            progress(READING_DATA, None)
        out = None
        try:
            with _quiet_pyspark():
                out = read(self.spark.sql(sql))
        except Exception:
            pass
        if out is None:
            # Spark's messages may quote row values: one message, no exception chain.
            raise ExecutionError(FAILED_AFTER_CHARGE)
        if progress is not None:
            progress(READING_DATA, 1.0)
        return out

    def close(self) -> None:
        for name in self._frames:
            self.spark.catalog.dropTempView(name)
        self._frames.clear()
        self._catalog = None
