"""Every MongoDB read and write of the node; nothing above this room imports
pymongo. A driver error never escapes a store method: it becomes
``node.errors.StoreUnavailable`` (retriable; ``boundary.py``).

What the rest of the node may ask of the store, method by method (what is
eligible, what each fence and version condition rejects, what is
journaled), is ``contract.py``: the Protocols ``Schedules``, ``BucketLeases``
and ``AttemptHistory``. ``statements.py`` writes each condition and change
once; ``schedules.py``, ``leases.py`` and ``history.py`` implement the
contract on MongoDB, ``memory.py`` in memory (for tests and benchmarks).
``tenants.TenantStore`` keeps the tenants and API keys, and
``documents.py`` says what a schedule document holds and which indexes
serve every query.
"""
