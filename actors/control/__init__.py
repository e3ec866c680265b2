"""The controller's decisions, pure: cluster metadata and its transitions (``metadata``),
elections (``election``), placement (``placement``), reassignment (``reassignment``), broker
sessions (``sessions``), health (``health``) and the configuration registry (``config_keys``).
``metadata_store`` persists the metadata with compare-and-swap through an object store it is
given."""
