"""A gateway's authorization: off, or Kafka's StandardAuthorizer over the ACLs it last polled.

One :class:`Authorization` per gateway, shared by its connections' request contexts. Its
``authorizer`` is None when ``authorizer.class.name`` is empty (every request allowed, as a
Kafka broker without an authorizer); else an :class:`~raylog.actors.control.acls.Authorizer`
built from the broker configs' ``super.users`` and ``allow.everyone.if.no.acl.found`` and the
ACLs of the cluster metadata, swapped whole by :meth:`update` when the polled ACLs change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from raylog.actors.control import acls, config_keys

__all__ = ["Authorization"]


class Authorization:
    """The current authorizer of a gateway (None: authorization off)."""

    def __init__(
        self,
        enabled: bool = False,
        super_users: Iterable[str] = (),
        allow_everyone_if_no_acl_found: bool = False,
        bindings: Iterable[acls.AclBinding] = (),
    ) -> None:
        self.enabled = enabled
        self._super_users = frozenset(super_users)
        self._allow_everyone = allow_everyone_if_no_acl_found
        self._bindings: tuple[acls.AclBinding, ...] | None = None
        self.authorizer: acls.Authorizer | None = None
        self.update(tuple(bindings))

    @classmethod
    def from_broker_configs(cls, overrides: Mapping[str, str] | None) -> Authorization:
        """From ``authorizer.class.name``, ``super.users`` and
        ``allow.everyone.if.no.acl.found`` (raises InvalidConfigError for bad values)."""
        config = config_keys.broker_config(overrides)
        return cls(
            enabled=bool(config.authorizer_class_name),
            super_users=acls.parse_super_users(config.super_users),
            allow_everyone_if_no_acl_found=config.allow_everyone_if_no_acl_found,
        )

    def update(self, bindings: tuple[acls.AclBinding, ...]) -> None:
        """Take the ACLs of newly polled metadata (a new authorizer only if they changed)."""
        if not self.enabled or bindings == self._bindings:
            return
        self._bindings = bindings
        self.authorizer = acls.Authorizer(bindings, self._super_users, self._allow_everyone)
