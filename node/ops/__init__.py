"""The process around the node: the ``python -m node`` command line, the
operator's ``ctl``, tenant administration, the topic reader, and the embedded
dev stack. Nothing in ``node/`` imports this but ``node/__main__.py``."""
