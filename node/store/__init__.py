"""Every MongoDB read and write of the node; nothing above this room imports
pymongo. A driver error never escapes a store method: it becomes
``node.errors.StoreUnavailable`` (retriable; ``boundary.py``).

The schedule store's contract (``schedules.ScheduleStore``), method by method:

* ``insert(new, now)``: store a new schedule in one write, journaled on a
  majority; concurrent calls share an ``insert_many``. The same client id
  with the same body returns the stored one (created False); with another
  body, ``ScheduleConflict``.
* ``get(id)``, ``list_page(listing)``, ``count_by_status(listing)``: read;
  a listing reads one range of the index its filter names
  (``listing.Listing``), in ``_id`` or due order.
* ``cancel(id, now, if_match)``: PENDING or PAUSED -> CANCELLED in one
  conditional write. The claim takes only PENDING schedules, so after it
  succeeds no owner holds the schedule and none ever will; too late:
  ``NotCancellable``; another version than ``if_match``: ``VersionMismatch``.
* ``change(id, decide, now, if_match)``: a verb (PATCH, pause, resume,
  trigger, retry): read, ``decide`` (``node/schedule/changes.py``), and
  write only where the schedule is still at the status and version read;
  lost to a concurrent write, read and decide again.
* ``cancel_matching(tenant, selector, now)``: cancel the tenant's PENDING
  and PAUSED schedules a ``listing.Selector`` matches, in bounded batches.
* ``find_due(buckets, until, limit, tenants)``: PENDING schedules of the
  caller's buckets due by ``until``, oldest first (and each tenant's oldest,
  for the poller to share fairly). Reads only; the claim decides.
* ``claim(docs, tokens, owner, now)``: PENDING -> IN_FLIGHT under each
  bucket's lease token, in one bulk write. A schedule is taken only if still
  PENDING, at the version read (no verb changed it since), and no newer
  token wrote it (``token <= mine``); returns the ``Claimed`` ones. Every
  write adds one to the schedule's ``version``.
* ``complete(completions)``: writes what delivery decided for each claimed
  schedule (``contract.Completion``, built by ``node/delivery/outcomes.py``),
  only where its token still holds it (IN_FLIGHT, ``token == mine``): a
  stale owner's completion matches nothing. Returns how many were written.
* ``recover_in_flight(tokens, stranded_before)``: schedules of our buckets
  left IN_FLIGHT under an older token (their owner died or lost its lease
  mid-batch), and under our own token by a claim made before
  ``stranded_before`` (older than any round of ours can be: a claim the
  server applied after its answer was lost), become PENDING under ours:
  re-delivered at least once.

``leases.LeaseStore`` keeps the ``buckets`` collection (lease documents,
judged by the server's clock), ``history.HistoryStore`` one record per
delivery attempt, ``tenants.TenantStore`` the tenants and API keys, and
``documents.py`` says what a schedule document holds and which indexes serve
every query.
"""
