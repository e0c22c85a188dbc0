"""The scheduler node, in rooms that each import only the ones below them
(the contracts in pyproject.toml, checked by ``lint-imports``):

* ``ops/``       the process around the node: ``python -m node`` (run, dev, tail, tenants, ctl)
* ``process``    builds every part from the config, starts and stops them in order
* ``api/``       the HTTP edge: routes, auth, views, errors as HTTP, the OpenAPI document
* ``delivery/``  the owner's side: ownership, the lease book, the poller, outcomes, Kafka
* ``store/``     every MongoDB read and write, behind the fencing token
* ``tenants/``   who may call and how much: tenants, keys, quotas, admission
* ``config``, ``metrics``, ``logs``   settings, Prometheus collectors, structured logs
* ``schedule/``  what a schedule is: model, parsing, recurrence, retry, times, its record (pure)
* ``errors``     the error hierarchy: codes, status hints, retriable
"""
