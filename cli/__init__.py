"""The ``headroom`` command line: the composition root that wires the core to the shells."""
