"""How replicas and gateways talk without Ray calls: framed channels over TCP + TLS or Unix
sockets (``channel``) and the same-host shared-memory produce arena (``arena``)."""
