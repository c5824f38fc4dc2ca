"""Marks the peer tests listed in ``expected_failures.txt`` as strict expected failures (the
plugin ``tests/peers/expected.py``). (Only the files ``python -m tests.peers.run`` names are
collected here.)"""

from tests.peers.expected import expected_failures, pytest_collection_modifyitems  # noqa: F401
