"""The lab: a local cluster of real node processes on the embedded servers,
its network namespaces and object store, the waits and figures every run
uses. ``bench/`` drives it too, and imports nothing else of ``chaos``."""
