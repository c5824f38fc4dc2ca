"""The kombu transport's tests (tests/transport/test_transport.py), every test unchanged, on Valkey."""

from tests.transport.conftest import url  # noqa: F401  (the transport tests' fixture)
from tests.transport.test_transport import *  # noqa: F403
