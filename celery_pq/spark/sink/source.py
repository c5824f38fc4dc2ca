"""The ``celery_pq`` data source: ``df.write`` (``batch.py``) and ``df.writeStream``
(``stream.py``), options in ``settings.py``. docs/spark.md ("From DataFrames to tasks").
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from ...storage.errors import ConfigError
from .batch import CeleryPQWriter
from .settings import WriterSettings
from .stream import CeleryPQStreamWriter


class CeleryPQDataSource(DataSource):
    """``df.write.format("celery_pq")`` and ``df.writeStream.format("celery_pq")``."""

    @classmethod
    def name(cls) -> str:
        return "celery_pq"

    def writer(self, schema: StructType, overwrite: bool) -> CeleryPQWriter:
        return CeleryPQWriter(self._settings(schema, overwrite, '.mode("append")'), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> CeleryPQStreamWriter:
        return CeleryPQStreamWriter(self._settings(schema, overwrite, 'outputMode("append")'), schema)

    def _settings(self, schema: StructType, overwrite: bool, append: str) -> WriterSettings:
        if overwrite:
            raise ConfigError(
                f"format 'celery_pq' only appends tasks to a queue: use {append} (a queue cannot be overwritten)"
            )
        return WriterSettings.parse(dict(self.options), schema.fieldNames())
