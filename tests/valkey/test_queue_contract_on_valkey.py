"""The Lua contract (tests/queue/test_queue_contract.py), every test unchanged, on Valkey."""

from tests.queue.test_queue_contract import *  # noqa: F403
