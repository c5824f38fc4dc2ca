"""PriorityQueue and its Lua scripts on a real redis-server: each operation called directly and
checked on the raw keys, plus the API fuzz test and the model-based stateful test, which drive
the same layer (PriorityQueue, no kombu) and compare every key of their prefix."""
