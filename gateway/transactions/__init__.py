"""Transactions (KIP-98): the pure state machine of one transactional id (``state``), the
records kept in ``__transaction_state`` (``records``) and the asyncio coordinator that runs
them (``coordinator``)."""
