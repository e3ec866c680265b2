"""Running a raylog cluster: the supervisor of the embedded cluster's brokers and gateways,
the Ray node watcher of a real Ray cluster, and the metrics endpoint. This package assembles
brokers with their gateways, so it may import ``raylog.gateway``; the rest of
``raylog.actors`` may not."""
