"""The bucket owner's side, in the order of the data flow:

membership view -> ``ownership`` (placement, hand-over) -> ``leases`` (the
book of this node's leases) -> ``poller`` (find due, claim, publish, complete)
-> ``publisher`` (Kafka). ``outcomes`` decides what each claimed schedule
becomes (pure), ``fairness`` shares a round among tenants, ``hints`` wakes
owners, ``history_writer`` records attempts off the delivery path, ``stalls``
measures the process standing still.
"""
