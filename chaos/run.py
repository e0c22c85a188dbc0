"""One chaos run: a scenario (``chaos/scenario.py``) played against the
lab's local cluster of real node processes (``chaos/lab/``), under the load
(``chaos/load.py``), by the fault player (``chaos/faults/player.py``),
every call and fault written into one history (``chaos/history.py``); then
the unknown outcomes settled (``chaos/settle.py``) and the history judged
with what the topic got and, when a share of the load goes by HTTP, what
the run's webhook receiver took (``chaos/receipts.py``), as one stream
(``chaos/checker/``).

Each fault gets a window from its start to the end of the recovery
allowance (failure detection plus a lease TTL); lateness is reported inside
each window and outside all of them. After each fault the player also
measures how long the cluster takes to settle again.
"""

from __future__ import annotations

import asyncio
import base64
import random
import secrets
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from chaos.checker import check, passed
from chaos.checker.model import (
    bulk_calls,
    chains,
    events,
    expected,
    refusals,
    unsettled,
    verb_answers,
)
from chaos.faults.player import Player
from chaos.history import CANCEL, DELIVERY_FAILED, INFO, OBSERVER, History, Topic
from chaos.lab.cluster import HOST, LocalCluster
from chaos.lab.harness import broker_stores, until
from chaos.lab.network import Namespaces, probe, sweep
from chaos.lab.receiver import Receiver
from chaos.load import Api, Load, Webhook
from chaos.observe import (
    Recorder,
    Sampler,
    judge_floods,
    note_stalls,
    note_unready,
    replay,
    served_late,
)
from chaos.receipts import ReceiverLog
from chaos.scenario import Scenario
from chaos.settle import needs_views, read_views, settle
from chaos.summary import render, write
from node.errors import StoreUnavailable
from node.schedule.model import public_id
from node.schedule.webhook import new_secret
from node.store.tenants import TenantStore
from node.tenants.model import Tenant

BUCKETS = 256  # the nodes' default bucket count
GRACE = 60.0  # after the load, how long every accepted schedule may take to arrive
LATE_COPIES = 2.0  # then how long late duplicates, if any, may take to arrive too
# With AUTH=on, the tenant whose key every call of the run carries.
ADMIN_TENANT = "chaos-admin"
# The most DELIVERY_FAILED schedules read back by id at the end.
FAILED_READ = 10_000


class Run:
    def __init__(
        self,
        scenario: Scenario,
        data_dir: Path,
        seed: int,
        *,
        unfenced: bool = False,
        namespaces: bool = True,
        settle_within: float = 120.0,
        external: tuple[str, str] | None = None,
    ) -> None:
        self.scenario = scenario
        # The fixed steps and those the seed draws for the ``any`` entries.
        self.steps = scenario.timeline(seed)
        # unfenced: nodes run without the fence (CHAOS_MODE=unfenced), to show
        # that the checker catches what the fence prevents.
        self.unfenced = unfenced
        self.seed = seed
        self.rng = random.Random(seed)
        self.history = History(meta={"buckets": BUCKETS, "scenario": scenario.name, "seed": seed})
        self.judged = self.history  # settled, and with what was observed, after the run
        network, filtered, reason = self._network(namespaces, external)
        mode = "unfenced" if unfenced else "on" if filtered else "off"
        env = {"CHAOS_MODE": mode}
        # A fresh key per run signs the gossip (and the wake-up hints); a
        # scenario without keys runs unsigned, which nodes take only when told.
        self.cluster_keys: tuple[bytes, ...] = ()
        if scenario.cluster_keys:
            self.cluster_keys = (secrets.token_bytes(32),)
            env["CLUSTER_KEYS"] = ",".join(base64.b64encode(k).decode() for k in self.cluster_keys)
        else:
            env["GOSSIP_UNSIGNED"] = "on"
        self.receiver: Receiver | None = None
        self.receipts: ReceiverLog | None = None
        if scenario.http_share:
            host = network.receiver_host if network is not None else HOST
            self.receiver = Receiver(host, data_dir, new_secret())
            # The nodes may reach the receiver's address only (the egress
            # policy refuses private and loopback ones unless named), and
            # sign with the secret it checks.
            env["HTTP_TARGETS_ALLOW"] = f"{host}/32"
            env["HTTP_SIGNING_SECRET"] = self.receiver.secret
        self.cluster = LocalCluster(
            data_dir,
            env=env,
            network=network,
            external=external,
            durable_broker=any(step.do == "crash-broker" for step in self.steps),
            auth=scenario.auth,
        )
        # Records of earlier runs stay in an external broker's topic.
        self.topic = f"chaos-{self.cluster.database}" if external else "chaos"
        self.network = "loopback (no partition in this scenario)"
        if network is not None or filtered:
            self.network = self.cluster.partition_kind
            if filtered:
                self.network += f"; namespaces not used: {reason}"
        self.player = Player(
            self.cluster,
            self.history,
            self.rng,
            unfenced=unfenced,
            cluster_keys=self.cluster_keys,
            no_namespaces=reason,
            settle_within=settle_within,
            receiver=self.receiver,
        )

    def _network(
        self, namespaces: bool, external: tuple[str, str] | None
    ) -> tuple[Namespaces | None, bool, str | None]:
        """Partitions and cuts take real links where network namespaces work;
        elsewhere (or with namespaces=False) partitions are the nodes'
        chaos-mode gossip filter and cuts from one server are skipped. The
        namespaces (None: none), whether the filter stands in, and why."""
        if not any(step.needs_namespaces for step in self.steps):
            return None, False, "no step here cuts a link"
        sweep()
        reason = probe() if namespaces else "turned off (--no-namespaces)"
        if external:
            # Nodes in namespaces reach only the bridge, not servers
            # elsewhere (no NAT tools on the kind of host this targets).
            reason = "the servers are external"
        if reason is None:
            return Namespaces(), False, None
        return None, any(step.partitions for step in self.steps), reason

    # -- the phases --------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        settler: asyncio.Task[None] | None = None
        try:
            await self._start_cluster()
            settler = asyncio.create_task(self.player.settler())
            load, recorder, sampler = await self._load_under_faults()
            views = await self._owed_arrive(recorder)
            await asyncio.sleep(LATE_COPIES)  # late duplicates, if any, arrive too
            # What no node could show before is asked again.
            views = {**(await self._views(needs_views(self.history) - set(views))), **views}
            await sampler.stop()
            return await self._judge(settle(self.history, views), recorder, sampler, load)
        finally:
            if settler is not None:
                settler.cancel()
            self.cluster.close()
            if self.receiver is not None:
                self.receiver.close()

    async def _start_cluster(self) -> None:
        self.cluster.start_servers()
        if self.receiver is not None:
            await asyncio.to_thread(self.receiver.start)
        if self.scenario.auth:
            self.cluster.api_key = await self._admin_key()
        if self.cluster.durable_broker:
            await broker_stores(self.cluster.kafka_bootstrap, 60)
        await asyncio.gather(
            *(self.player.start(self.player.new_name()) for _ in range(self.scenario.nodes))
        )
        await until(self.cluster.settled, 90, "the first nodes to settle")

    async def _load_under_faults(self) -> tuple[Load, Recorder, Sampler]:
        """The load and the timeline together, with the sampler beside them;
        then every step's aftermath."""
        sampler = Sampler(self.cluster, self.player.running, self.player.store_cut)

        def serving() -> list[str]:
            return self._urls(sampler.serving(self.player.running()))

        async with Api(serving, self.rng, headers=self.cluster.headers, timeout=10) as api:
            load = Load(
                self.history,
                api,
                self.rng,
                topic=self.topic,
                rate=self.scenario.rate,
                duration=self.scenario.duration,
                webhook=self._webhook(),
            )
            # The readers name a recurring schedule's records by occurrence
            # from its create on.
            recorder = Recorder(self.cluster.kafka_bootstrap, self.topic, load.recurring)
            if self.receiver is not None:
                self.receipts = ReceiverLog(self.receiver.log_path, load.recurring)
            await recorder.start()
            self.history.started = time.time()
            sampler.start(self.history.started)
            await asyncio.gather(load.run(), self.player.play_all(self.steps))
        await self.player.aftermath()
        return load, recorder, sampler

    def _webhook(self) -> Webhook | None:
        if self.receiver is None:
            return None
        # Its own random source, drawn in the order the schedules are made:
        # which of them go by HTTP is the same for the same seed.
        rng = random.Random(f"sinks {self.seed}")
        return Webhook(self.receiver.url, self.scenario.http_share, rng)

    def _received(self) -> set[str]:
        """The units the receiver took, and those it refused for good (read
        from its log now)."""
        if self.receipts is None:
            return set()
        self.receipts.read()
        return self.receipts.units() | self.receipts.refused

    def _urls(self, names: list[str]) -> list[str]:
        return [self.cluster.nodes[name].url for name in names]

    async def _views(self, ids: set[str]) -> dict[str, dict[str, Any]]:
        return await read_views(
            lambda: self._urls(self.player.running()), ids, self.cluster.headers
        )

    async def _owed_arrive(self, recorder: Recorder) -> dict[str, dict[str, Any]]:
        """Who is owed a delivery: the verbs' unknown outcomes settled, the
        bulk cancels' takings found; then wait until every unit owed has
        arrived (or GRACE has passed). The views that settled them."""
        views = await self._views(needs_views(self.history))
        owed = expected(settle(self.history, views))

        def all_arrived() -> bool:
            return owed <= {r[0] for r in recorder.records} | self._received()

        await until(all_arrived, GRACE, "every accepted schedule", strict=False)
        return views

    async def _judge(
        self, settled: History, recorder: Recorder, sampler: Sampler, load: Load
    ) -> dict[str, Any]:
        samples = sampler.samples
        note_stalls(settled, samples)
        garbage_failed = judge_floods(settled, samples)
        note_unready(settled, samples)
        statuses = await self._statuses()
        for failed in await self._failed():
            settled.event(OBSERVER, DELIVERY_FAILED, time.time(), **failed)
        await recorder.stop()
        live = {r[0] for r in recorder.records} | self._received()
        replayed = await replay(
            self.cluster.kafka_bootstrap,
            self.topic,
            load.recurring,
            len(recorder.records),
            wanted=expected(settled) - live,
        )
        self.judged = settled
        self._received()
        late = served_late(recorder.deliveries, replayed)
        received = Topic(
            (*recorder.deliveries, *(self.receipts.deliveries if self.receipts else ())),
            frozenset(d.schedule_id for d in replayed),
            frozenset(self.receipts.refused if self.receipts else ()),
            late,
        )
        result = check(settled, received)
        if self.receipts is not None:
            result.update(receiver_figures(self.receipts))
        result.update(
            scenario=self.scenario.name,
            auth=self.scenario.auth,
            cluster_keys=bool(self.cluster_keys),
            skewed_at_end=dict(self.player.skewed),
            statuses=statuses,
            stranded=statuses.get("IN_FLIGHT", 0),
            # In the topic, found only by the fresh reader at the end.
            served_late=len({d.schedule_id for d in late}),
            served_late_ids=sorted({d.schedule_id for d in late})[:20],
            garbage_failures=len(garbage_failed),
            garbage_failed=garbage_failed,
            chains=len(chains(settled)),
            unfenced=self.unfenced,
            network=self.network,
            seed=self.seed,
            settings=asdict(self.scenario),
            refused=sum(refusals(settled).values()),
            cancels_unanswered=sum(1 for c in self.history.calls(CANCEL) if c.type == INFO),
            verbs=verb_answers(settled),
            bulk_calls=bulk_calls(settled),
            unsettled=unsettled(settled),
            refusals=dict(refusals(settled).most_common(10)),
            events=events(settled),
            samples=samples,
            started=settled.started,
        )
        result["passed"] = passed(result)
        return result

    # -- the store ---------------------------------------------------------------

    async def _admin_key(self) -> str:
        """An admin tenant and its API key, made in the run's database (the
        operator routes, /v1/cluster among them, need an admin's key)."""
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            self.cluster.mongo_uri, serverSelectionTimeoutMS=5000
        )
        tenants = TenantStore(client[self.cluster.database])
        try:
            for attempt in range(10):
                try:
                    return await tenants.add(
                        Tenant(name=ADMIN_TENANT, admin=True), datetime.now(UTC)
                    )
                except StoreUnavailable:
                    if attempt == 9:
                        raise
                    await asyncio.sleep(1.0)
            raise AssertionError("unreachable")
        finally:
            await client.close()

    async def _statuses(self) -> dict[str, int]:
        """How many schedules the store holds in each status at the end (a
        DELIVERY_FAILED one is a schedule given up on, whatever Kafka got)."""
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            self.cluster.mongo_uri, serverSelectionTimeoutMS=5000
        )
        try:
            rows = await (
                await client[self.cluster.database].schedules.aggregate(
                    [{"$group": {"_id": "$status", "n": {"$sum": 1}}}]
                )
            ).to_list()
        except PyMongoError as exc:  # a figure for the report, not a verdict
            return {f"unknown ({type(exc).__name__})": 0}
        finally:
            await client.close()
        return {str(row["_id"]): int(row["n"]) for row in sorted(rows, key=lambda r: str(r["_id"]))}

    async def _failed(self) -> list[dict[str, Any]]:
        """The schedules the store holds DELIVERY_FAILED at the end: each
        its id and last error (none when the store cannot say: the status
        count says how many)."""
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            self.cluster.mongo_uri, serverSelectionTimeoutMS=5000
        )
        try:
            cursor = client[self.cluster.database].schedules.find(
                {"status": "DELIVERY_FAILED"}, {"_id": 1, "lastError": 1}, limit=FAILED_READ
            )
            docs = await cursor.to_list()
        except PyMongoError:
            return []
        finally:
            await client.close()
        return [
            {"id": public_id(str(doc["_id"])), "error": str(doc.get("lastError") or "")[:200]}
            for doc in docs
        ]


def receiver_figures(receipts: ReceiverLog) -> dict[str, Any]:
    """What the receiver answered, for the summary: every answer by status,
    the attempt each request it took (a 2xx) carried (a 503 with
    Retry-After spends none, so an outage of those leaves them at 1), the
    units it refused for good, the requests that failed their signatures
    (which fails a run) and those that named no schedule."""
    attempts = Counter(d.attempt for d in receipts.deliveries)
    return {
        "receiver_answers": {str(k): v for k, v in sorted(receipts.answers.items())},
        "receiver_attempts": {str(k): v for k, v in sorted(attempts.items())},
        "receiver_refused": len(receipts.refused),
        "receiver_unnamed": receipts.unnamed,
        "bad_signatures": len(receipts.unsigned),
        "bad_signatures_ids": sorted(receipts.unsigned)[:20],
    }


def keep_failed_logs(result: dict[str, Any], data_dir: Path, out: Path | None) -> Path | None:
    """A failed run's node, store, broker and receiver logs, copied beside
    its summary (``out/logs``) before its data directory goes: a rare
    failure is otherwise gone with it (everything seed 1 once left a
    schedule IN_FLIGHT, and nothing to read). A passed run keeps none
    (``--keep`` keeps everything). Returns where they went."""
    logs = data_dir / "logs"
    if result.get("passed") or out is None or not logs.is_dir():
        return None
    kept = out / "logs"
    shutil.copytree(logs, kept, dirs_exist_ok=True)
    return kept


def main(
    scenario: Scenario,
    seed: int,
    out: Path | None,
    keep: Path | None,
    *,
    unfenced: bool = False,
    namespaces: bool = True,
    external: tuple[str, str] | None = None,
) -> int:
    async def play(data_dir: Path) -> tuple[dict[str, Any], History]:
        run = Run(
            scenario, data_dir, seed, unfenced=unfenced, namespaces=namespaces, external=external
        )
        return await run.run(), run.judged

    kept_logs: Path | None = None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        result, history = asyncio.run(play(keep))
    else:
        with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
            result, history = asyncio.run(play(Path(tmp)))
            kept_logs = keep_failed_logs(result, Path(tmp), out)
    print(render(result))
    if out is not None:
        write(result, out, history)
        print(f"wrote {out / 'summary.json'}, {out / 'report.html'} and {out / 'history.jsonl'}")
    if kept_logs is not None:
        print(f"the run failed: its logs are in {kept_logs}")
    return 0 if result["passed"] else 1
