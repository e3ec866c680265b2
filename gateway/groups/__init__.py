"""Consumer groups: the pure group state machine (``group``), the records kept in
``__consumer_offsets`` (``records``) and the asyncio coordinator that runs them
(``coordinator``)."""
