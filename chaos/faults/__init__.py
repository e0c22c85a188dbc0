"""The fault player (``player.py``), what each fault is (``kinds.py``) and
the hostile-gossip sender (``garbage.py``)."""
