"""Request handlers, one module per Kafka API, and the registry the server dispatches on.

To add an API: write ``handlers/<api>.py`` with ``API_KEY`` and ``async def handle(context,
request)`` (the contract is ``handlers/context.py``'s), import it here and add it to
``_MODULES``. Its versions come from ``apis.TARGET_VERSIONS`` and it is advertised from then on.
Handlers raise only for bugs: expected failures become error codes in the response, because an
exception escaping a handler closes the client's connection. The one deliberate exception is
:class:`CloseConnection`, for the cases where Kafka answers by closing.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType, ModuleType

from raylog.gateway import apis
from raylog.gateway.handlers import (
    add_offsets_to_txn,
    add_partitions_to_txn,
    alter_client_quotas,
    alter_configs,
    alter_user_scram_credentials,
    api_versions,
    create_acls,
    create_partitions,
    create_topics,
    delete_acls,
    delete_groups,
    delete_records,
    delete_topics,
    describe_acls,
    describe_client_quotas,
    describe_configs,
    describe_groups,
    describe_transactions,
    describe_user_scram_credentials,
    elect_leaders,
    end_txn,
    fetch,
    find_coordinator,
    heartbeat,
    incremental_alter_configs,
    init_producer_id,
    join_group,
    leave_group,
    list_groups,
    list_offsets,
    list_transactions,
    metadata,
    offset_commit,
    offset_delete,
    offset_fetch,
    produce,
    sasl_authenticate,
    sasl_handshake,
    sync_group,
    txn_offset_commit,
)
from raylog.gateway.handlers.context import CloseConnection, Handler, RequestContext, per_partition

__all__ = [
    "HANDLERS",
    "CloseConnection",
    "Handler",
    "RequestContext",
    "advertised_versions",
    "per_partition",
]

_MODULES: tuple[ModuleType, ...] = (
    # the connection: versions, authentication
    api_versions,
    sasl_handshake,
    sasl_authenticate,
    # metadata and the data path
    metadata,
    produce,
    fetch,
    list_offsets,
    delete_records,
    init_producer_id,
    # transactions, through their coordinator
    add_partitions_to_txn,
    add_offsets_to_txn,
    end_txn,
    txn_offset_commit,
    describe_transactions,
    list_transactions,
    # admin, through the controller
    create_topics,
    delete_topics,
    create_partitions,
    describe_configs,
    alter_configs,
    incremental_alter_configs,
    elect_leaders,
    describe_user_scram_credentials,
    alter_user_scram_credentials,
    describe_acls,
    create_acls,
    delete_acls,
    describe_client_quotas,
    alter_client_quotas,
    # consumer groups
    find_coordinator,
    join_group,
    sync_group,
    heartbeat,
    leave_group,
    offset_commit,
    offset_fetch,
    list_groups,
    describe_groups,
    delete_groups,
    offset_delete,
)


def _table(modules: tuple[ModuleType, ...]) -> Mapping[int, Handler]:
    table: dict[int, Handler] = {}
    for module in modules:
        if module.API_KEY in table:
            raise RuntimeError(f"two handler modules for API {module.API_KEY}")
        table[module.API_KEY] = module.handle
    return MappingProxyType(table)


HANDLERS: Mapping[int, Handler] = _table(_MODULES)


def advertised_versions(
    handlers: Mapping[int, Handler] = HANDLERS,
) -> Mapping[int, tuple[int, int]]:
    """The ApiVersions table for a gateway serving ``handlers``."""
    return apis.advertised_versions(handlers.keys())
