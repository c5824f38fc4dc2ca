"""The Lua contract (tests/lua/test_queue_contract.py), every test unchanged, on Valkey."""

from tests.lua.test_queue_contract import *  # noqa: F403
