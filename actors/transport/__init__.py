"""How replicas and gateways talk without Ray calls: framed channels over TCP + TLS or Unix
sockets (``channel``, the public surface of ``frames``, ``connection``, ``auth``, ``server`` and
``links``) and the same-host shared-memory produce arena (``arena``)."""
