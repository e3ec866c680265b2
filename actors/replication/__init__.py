"""Replication of one partition, pure: the replica state machine (``partition``, with its
leader's and follower's sides in ``leader`` and ``follower``, its rules in ``isr`` and
``delete_records``, its log view in ``replica_log`` and shared state in ``replica_state``), its
idempotent-producer state (``producer_state``), the messages between replicas (``messages``)
and the contract with the shell that runs it (``ready``). No Ray, asyncio, sockets, clock or
randomness: time and messages come in as arguments."""
