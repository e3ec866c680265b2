"""Cross-cluster links on the destination (KIP-986): the fetchers that mirror a source
cluster's partitions into the mirror partitions this broker leads (``mirrors``)."""
