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
        if overwrite:
            raise ConfigError(
                "format 'celery_pq' only appends tasks to a queue: use .mode(\"append\") "
                "(a queue cannot be overwritten)"
            )
        return CeleryPQWriter(WriterSettings.parse(dict(self.options), schema.fieldNames()), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> CeleryPQStreamWriter:
        if overwrite:
            raise ConfigError(
                "format 'celery_pq' only appends tasks to a queue: use outputMode(\"append\") "
                "(a queue cannot be overwritten)"
            )
        return CeleryPQStreamWriter(WriterSettings.parse(dict(self.options), schema.fieldNames()), schema)
