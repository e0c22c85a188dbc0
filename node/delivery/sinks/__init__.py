"""Where deliveries go: one small interface (``node/delivery/sink.py``), two
adapters (``kafka.py``, ``http.py``) and the router that sends a round's
records and calls to them at once (``router.py``)."""
