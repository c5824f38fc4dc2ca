"""What several test folders share."""

import pytest
from kombu import Producer

#: ``Producer.batch()`` came with kombu 5.7: its tests skip on an older kombu pyproject.toml accepts.
needs_producer_batch = pytest.mark.skipif(not hasattr(Producer, "batch"), reason="Producer.batch() came with kombu 5.7")
