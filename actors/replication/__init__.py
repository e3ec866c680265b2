"""Replication of one partition, pure: the replica state machine (``partition``), its
idempotent-producer state (``producer_state``), the messages between replicas (``messages``)
and the contract with the shell that runs it (``ready``). No Ray, asyncio, sockets, clock or
randomness: time and messages come in as arguments."""
