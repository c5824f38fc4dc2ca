"""The model-based stateful tests (tests/queue/test_model.py runs them): a reference model of a
queue's documented behaviour, the hypothesis state machines that drive a real queue beside it,
and the checks made after every step.

- ``common``        settings profiles, the skip names (PQ_MODEL_SKIP), the shared constants
- ``fair``          the reference model of start-time fair queueing (lua/includes/fair.lua)
- ``queue_machine`` one queue through the queue API: the rules (QueueMachine)
- ``queue_checks``  its invariants and the final drain (QueueChecks)
- ``fair_machine``  the fair and the corrupting variants of QueueMachine
- ``ledger``        every publish accounted for: what became of it, and who stands for it
- ``clock``         a Redis clock step, as the queue's stored times moved against the clock
- ``unique_machine`` unique keys, all five modes, through kombu (UniqueMachine)
- ``rate_machine``  task and tenant rates on plain and sharded queues (RateMachine)
- ``publish_machine`` publishes routed to several queues with lost replies, expiry, and a
                    second process with other options (PublishMachine)
"""
