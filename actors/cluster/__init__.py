"""Running a raylog cluster, apart from any command line: the steps before its actors start
(``bootstrap``), the embedded cluster (``embedded``) and raylog on an existing Ray cluster
(``raynodes``), the supervisor of their brokers and gateways, the Ray node watcher, and the
metrics endpoint. This package assembles brokers with their gateways, so it may import
``raylog.gateway``; the rest of ``raylog.actors`` may not."""
